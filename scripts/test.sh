#!/usr/bin/env bash
# Installs the dependencies, builds everything and runs every test (the README's test command):
# the whole suite against Debian 12's LibTorch 1.13 (build/), the .deb packages made from it installed
# in a fresh Debian 12 root (scripts/test_package.sh), then against Debian 13's LibTorch 2.6
# in a cached Debian 13 root (build-torch2/, scripts/test_torch2.sh), then the CUDA LibTorch 2.6
# compile-and-link check (build-cuda/, scripts/build_cuda.sh), then the sanitizer builds
# (build-asan/, build-tsan/: scripts/test_sanitizers.sh) and the fuzz targets (build-fuzz/:
# scripts/test_fuzz.sh). Each part runs whatever the others did; the script fails, naming the parts
# that failed, if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# A test that needs Python torch fails instead of skipping: it is installed above (and in part 1,
# so do the real-Slurm test: slurmctld, slurmd and munge are, and the replicated coordinators'
# tests: etcd is).
export LAUNCH_TEST_REQUIRE_TORCH=1
failed=()

# part NAME COMMAND...: runs one part, records it as failed when it fails, prints its time.
part() {
  local name=$1 start=$SECONDS
  shift
  "$@" || failed+=("$name")
  echo "test.sh: $name took $((SECONDS - start)) s"
}

torch1=$(dpkg-query -W -f='${Version}' libtorch-dev)
test_torch1() {
  echo "test.sh: LibTorch $torch1 (Debian 12), build/"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j "$(nproc)" &&
    LAUNCH_TEST_REQUIRE_SLURM=1 LAUNCH_TEST_REQUIRE_ETCD=1 ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300 &&
    echo "test.sh: every test passed against LibTorch $torch1"
}

part "LibTorch $torch1 (Debian 12)" test_torch1
part "Debian packages (Debian 12 root)" bash scripts/test_package.sh build
part "LibTorch 2.6 (Debian 13 root)" bash scripts/test_torch2.sh
part "CUDA LibTorch 2.6 compile and link" bash scripts/build_cuda.sh
part "sanitizers (ASan+UBSan, TSan)" bash scripts/test_sanitizers.sh
# 30 s per target here (test_fuzz.sh's default is 60): CI's whole run must stay within an hour.
part "fuzz targets" env LAUNCH_FUZZ_SECONDS="${LAUNCH_FUZZ_SECONDS:-30}" bash scripts/test_fuzz.sh

if [ ${#failed[@]} -gt 0 ]; then
  printf 'test.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test.sh: all passed (LibTorch $torch1, the .deb packages, LibTorch 2.6, CUDA LibTorch 2.6 build, sanitizers, fuzzers)"
