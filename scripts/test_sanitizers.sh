#!/usr/bin/env bash
# The sanitizer runs of the README's test command (scripts/test.sh calls this):
#  - AddressSanitizer + UndefinedBehaviorSanitizer: every test of the suite, against Debian 12's
#    LibTorch, in build-asan/ (-O1: the instrumented build is what takes time here);
#  - ThreadSanitizer: the unit, agent, coordinator RPC and multi-node suites (and the launch and
#    test_worker they run) in build-tsan/, without LibTorch.
# Any report fails the run: no sanitizer recovers and carries on (LAUNCH_SANITIZE adds
# -fno-sanitize-recover=all), and the options below make reports fatal where they are not.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
failed=()
took() { echo "test_sanitizers.sh: $1 took $((SECONDS - $2)) s"; }

# Leaks are reported at exit of every instrumented process (launch, the tests, test_worker).
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
start=$SECONDS
if cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
     -DLAUNCH_SANITIZE=address,undefined &&
   cmake --build build-asan -j "$jobs" &&
   ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600; then
  echo "test_sanitizers.sh: ASan+UBSan: every test passed with no report"
else
  failed+=("ASan+UBSan (build-asan/)")
fi
took "ASan+UBSan" $start

# gRPC, protobuf and abseil are not instrumented: their own synchronisation (abseil's futex-based
# Mutex) is invisible to TSan, so races between two of their threads would be false reports; the
# suppressions in scripts/tsan.supp cover only frames inside those libraries, never our code
# (linked dynamically here, so that the suppressions can name them).
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp"
start=$SECONDS
tsan_ok=1
if cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
     -DLAUNCH_SANITIZE=thread -DLAUNCH_WITH_TORCH=OFF -DLAUNCH_STATIC_DEPS=OFF &&
   cmake --build build-tsan -j "$jobs" --target unit_tests agent_tests coordinator_rpc_tests multinode_tests launch test_worker; then
  for suite in unit_tests agent_tests coordinator_rpc_tests multinode_tests; do
    echo "test_sanitizers.sh: TSan: $suite"
    if ! "build-tsan/bin/$suite" --gtest_brief=1; then tsan_ok=0; echo "test_sanitizers.sh: TSan: $suite FAILED" >&2; fi
  done
else
  tsan_ok=0
fi
[ $tsan_ok = 1 ] && echo "test_sanitizers.sh: TSan: every suite passed with no report" || failed+=("TSan (build-tsan/)")
took "TSan" $start

if [ ${#failed[@]} -gt 0 ]; then
  printf 'test_sanitizers.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
