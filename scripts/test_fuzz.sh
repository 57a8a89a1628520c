#!/usr/bin/env bash
# The fuzz runs of the README's test command (scripts/test.sh calls this): each libFuzzer target
# of tests/fuzz (clang 14, with ASan+UBSan, in build-fuzz/) runs for LAUNCH_FUZZ_SECONDS (default
# 60) from its seed corpus in tests/fuzz/corpus/<target> (read only: new inputs go to a scratch
# directory). A crash, a sanitizer report, a leak or a timeout fails the run; the input that did it
# is saved in build-fuzz/findings/ (keep it in the corpus once it is fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${LAUNCH_FUZZ_SECONDS:-60}
case "$seconds" in ''|*[!0-9]*) echo "test_fuzz.sh: LAUNCH_FUZZ_SECONDS=$seconds: expected whole seconds" >&2; exit 2 ;; esac
targets=(cli lease rendezvous coordinator_rpc store)
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
  -DLAUNCH_FUZZ=ON -DLAUNCH_SANITIZE=address,undefined -DLAUNCH_WITH_TORCH=OFF -DLAUNCH_BUILD_TESTS=OFF
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
mkdir -p build-fuzz/findings
failed=()
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  echo "test_fuzz.sh: fuzz_$t for $seconds s"
  if ! build-fuzz/bin/fuzz_$t -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="build-fuzz/findings/$t-" "$scratch" "tests/fuzz/corpus/$t" > "build-fuzz/fuzz_$t.log" 2>&1; then
    failed+=("fuzz_$t")
    tail -n 60 "build-fuzz/fuzz_$t.log" >&2
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added" "build-fuzz/fuzz_$t.log" | sed "s/^/test_fuzz.sh: fuzz_$t: /" || true
  rm -rf "$scratch"
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'test_fuzz.sh: FAILED: %s (inputs in build-fuzz/findings/)\n' "${failed[@]}" >&2
  exit 1
fi
echo "test_fuzz.sh: every target ran $seconds s with no finding"
