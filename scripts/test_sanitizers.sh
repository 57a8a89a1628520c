#!/usr/bin/env bash
# The sanitizer runs of the README's test command (scripts/test.sh calls this):
#  - AddressSanitizer + UndefinedBehaviorSanitizer: every test of the suite, against Debian 12's
#    LibTorch, in build-asan/ (-O1: the instrumented build is what takes time here);
#  - ThreadSanitizer: the unit, agent and multi-node suites in build-tsan/, without LibTorch (see
#    below for why not the coordinator's threads).
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
# Leaks inside Debian's libraries only (tests/lsan.supp says which and why).
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
start=$SECONDS
if cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
     -DLAUNCH_SANITIZE=address,undefined &&
   cmake --build build-asan -j "$jobs" &&
   ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600 -E 'MultiNodeChaos'; then
  echo "test_sanitizers.sh: ASan+UBSan: every test passed with no report"
else
  failed+=("ASan+UBSan (build-asan/)")
fi
took "ASan+UBSan" $start

# ThreadSanitizer over the suites whose threads are ours: the console writers, the agent's
# background calls and coordinator watch, the supervision loop (the module suites), and the
# multi-node suite with every agent built with TSan against a standalone coordinator that is not
# (build/bin/launch, from part 1 of scripts/test.sh). gRPC, abseil, protobuf and OpenSSL come
# from Debian uninstrumented, so the TSan build links them shared and tests/tsan.supp ignores the
# interceptor calls made inside them (their own locks are invisible to TSan); no race in our code
# is suppressed. The coordinator is left out: its threads are gRPC's, which hands every reactor
# and message between its threads with that invisible synchronization, so each RPC handler would
# be reported (tried). So the multi-node tests whose coordinator lives in a TSan-built launch (an
# agent that hosts it; static ranks) do not run here, nor the chaos soak (scripts/test.sh runs
# it). The coordinator's paths are covered by the ASan+UBSan run, the RPC fuzzer and its
# one-mutex rule instead.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
start=$SECONDS
tsan_ok=1
tsan_suites="common_tests probes_tests rendezvous_tests agent_tests doctor_tests launcher_tests"
coordinator_bin=$PWD/build/bin/launch
tsan_skip="*Chaos*:MultiNode.ThreeAgentsWithDifferentLocalSizesOneHostsTheCoordinator"
tsan_skip+=":MultiNode.AgentHostedCoordinatorLostWithItsNodeFailsTheJobCleanly:MultiNode.StaticBackendGivesRanksFromNodeRank"
tsan_skip+=":MultiNode.EveryNodeStoppedAtOnce*:MultiNode.TheHostStoppedAloneEndsTheJobOnTheOtherNodeAtOnce"
if [ ! -x "$coordinator_bin" ]; then
  echo "test_sanitizers.sh: TSan: $coordinator_bin is missing (scripts/test.sh builds it first)" >&2
  tsan_ok=0
elif cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
     -DLAUNCH_SANITIZE=thread -DLAUNCH_WITH_TORCH=OFF -DLAUNCH_STATIC_DEPS=OFF &&
   cmake --build build-tsan -j "$jobs" --target $tsan_suites multinode_tests launch test_worker; then
  for suite in $tsan_suites; do
    echo "test_sanitizers.sh: TSan: $suite"
    if ! "build-tsan/bin/$suite" --gtest_brief=1; then tsan_ok=0; echo "test_sanitizers.sh: TSan: $suite FAILED" >&2; fi
  done
  echo "test_sanitizers.sh: TSan: multinode_tests (agents under TSan, coordinator $coordinator_bin)"
  if ! LAUNCH_TEST_COORDINATOR_BIN=$coordinator_bin build-tsan/bin/multinode_tests --gtest_brief=1 \
         "--gtest_filter=-$tsan_skip"; then
    tsan_ok=0
    echo "test_sanitizers.sh: TSan: multinode_tests FAILED" >&2
  fi
else
  tsan_ok=0
fi
[ $tsan_ok = 1 ] && echo "test_sanitizers.sh: TSan: every suite passed with no report" || failed+=("TSan (build-tsan/)")
took "TSan" $start

if [ ${#failed[@]} -gt 0 ]; then
  printf 'test_sanitizers.sh: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
