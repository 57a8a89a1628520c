#!/usr/bin/env bash
# The whole suite against LibTorch 2.6 and Python torch 2.6: builds launch, worker_sdk, the
# examples and every test inside the Debian 13 root (scripts/debian13_root.sh) into
# build-torch2/ and runs ctest there, the multi-node, Python and SDK tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(bash scripts/debian13_root.sh)
torch=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' libtorch-dev)
python_torch=$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Version}' python3-torch)
jobs=$(nproc)
echo "test_torch2.sh: LibTorch $torch and Python torch $python_torch (Debian 13 root $root), build-torch2/"
fail() {
  echo "test_torch2.sh: FAILED against LibTorch $torch, Python torch $python_torch (Debian 13 root $root): $1" >&2
  exit 1
}
# Debian 13's torch is built without libuv, and torch >= 2.4 asks for it by default: both
# torchrun and launch fail in init_process_group ("use_libuv was requested but PyTorch was build
# without libuv support") unless USE_LIBUV=0, which the Python workers of the tests get here.
# LAUNCH_TEST_REQUIRE_TORCH=1: a test that needs Python torch fails instead of skipping; the same
# for etcd (the replicated coordinators' tests, against Debian 13's etcd 3.5).
in_root=(bash scripts/in_root.sh "$root" --env USE_LIBUV=0 --env LAUNCH_TEST_REQUIRE_TORCH=1
  --env LAUNCH_TEST_REQUIRE_ETCD=1 --)
"${in_root[@]}" cmake -S /src -B /src/build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo || fail "cmake configure"
"${in_root[@]}" cmake --build /src/build-torch2 -j "$jobs" || fail "build"
"${in_root[@]}" ctest --test-dir /src/build-torch2 --output-on-failure -j "$jobs" --timeout 300 || fail "ctest"
echo "test_torch2.sh: every test passed against LibTorch $torch"
