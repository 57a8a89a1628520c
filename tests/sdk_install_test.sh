#!/usr/bin/env bash
# Installs worker_sdk from the build tree into a temporary prefix, builds the user project in
# examples/external_project against it with find_package(LaunchSDK), and runs it under launch.
set -euo pipefail
build_dir=$1
src_dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" > "$tmp/install.log"
test -f "$tmp/prefix/lib/cmake/LaunchSDK/LaunchSDKConfig.cmake"
test -f "$tmp/prefix/include/launch_sdk/ddp.h"
test -f "$tmp/prefix/include/launch_sdk/progress.h"  # the contract, installed with the SDK
test -f "$tmp/prefix/include/launch_sdk/contract.h"
# A step that fails shows its log.
run_logged() {
  local log=$1
  shift
  "$@" > "$log" 2>&1 || { cat "$log" >&2; echo "sdk_install_test.sh: failed: $*" >&2; exit 1; }
}
run_logged "$tmp/configure.log" cmake -S "$src_dir/examples/external_project" -B "$tmp/ext" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix"
run_logged "$tmp/build.log" cmake --build "$tmp/ext"
out=$("$build_dir/bin/launch" --nproc-per-node=2 "$tmp/ext/allreduce_hello")
echo "$out"
grep -q '^\[0\]:rank 0 of 2 on gloo: allreduce=3$' <<<"$out"
grep -q '^\[1\]:rank 1 of 2 on gloo: allreduce=3$' <<<"$out"
echo "external project OK"
