#!/usr/bin/env bash
# Installs the dependencies, builds everything and runs every test (the README's test command):
# the whole suite against Debian 12's LibTorch 1.13 (build/), then against Debian 13's LibTorch 2.6
# in a cached Debian 13 root (build-torch2/, scripts/test_torch2.sh), then the CUDA LibTorch 2.6
# compile-and-link check (build-cuda/, scripts/build_cuda.sh), then the sanitizer builds
# (build-asan/, build-tsan/: scripts/test_sanitizers.sh) and the fuzz targets (build-fuzz/:
# scripts/test_fuzz.sh). Each part runs whatever the others did; the script fails, naming the parts
# that failed, if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# A test that needs Python torch fails instead of skipping: it is installed above.
export LAUNCH_TEST_REQUIRE_TORCH=1
failed=()

took() { echo "test.sh: $1 took $((SECONDS - $2)) s"; }

torch1=$(dpkg-query -W -f='${Version}' libtorch-dev)
echo "test.sh: LibTorch $torch1 (Debian 12), build/"
start=$SECONDS
if cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j "$(nproc)" &&
   ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300; then
  echo "test.sh: every test passed against LibTorch $torch1"
else
  echo "test.sh: FAILED against LibTorch $torch1 (Debian 12), build/" >&2
  failed+=("LibTorch $torch1 (Debian 12)")
fi
took "LibTorch $torch1" $start

start=$SECONDS
bash scripts/test_torch2.sh || failed+=("LibTorch 2.6 (Debian 13 root)")
took "LibTorch 2.6" $start
start=$SECONDS
bash scripts/build_cuda.sh || failed+=("CUDA LibTorch 2.6 compile and link")
took "the CUDA build" $start
start=$SECONDS
bash scripts/test_sanitizers.sh || failed+=("sanitizers (ASan+UBSan, TSan)")
took "the sanitizer runs" $start
start=$SECONDS
bash scripts/test_fuzz.sh || failed+=("fuzz targets")
took "the fuzz runs" $start

if [ ${#failed[@]} -gt 0 ]; then
  printf 'test.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test.sh: all passed (LibTorch $torch1, LibTorch 2.6, CUDA LibTorch 2.6 build, sanitizers, fuzzers)"
