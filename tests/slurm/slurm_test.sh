#!/usr/bin/env bash
# launch under a real Slurm: brings up the cluster of cluster.sh (slurmctld, munged and two
# slurmd nodes in network namespaces), runs `srun -N2 --ntasks-per-node=1 launch ...` with no
# topology flags (launch reads the step's SLURM_* variables), and tears everything down on every
# exit path.
#   slurm_test.sh LAUNCH_BIN TRAIN_MLP_BIN
# Exit 0: every case passed; 1: a case failed (its output and the daemons' logs are shown); 77:
# skipped (not root, Slurm or munge not installed, no namespaces), or a failure instead with
# LAUNCH_TEST_REQUIRE_SLURM=1.
# LAUNCH_SLURM_EXPLICIT_FLAGS=1 gives launch the topology as flags instead, from the same
# variables (--nnodes, --node-rank, --rdzv-endpoint=<first host>:29400, --rdzv-id): for a launch
# without Slurm detection.
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 LAUNCH_BIN TRAIN_MLP_BIN" >&2
  exit 2
fi
launch=$(readlink -f "$1")
train=$(readlink -f "$2")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"

failures=()
dump_on_exit=0
on_exit() {
  local rc=$?
  trap - EXIT INT TERM HUP
  ((dump_on_exit)) && sl_dump_logs
  sl_down
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

skip() {
  if [ "${LAUNCH_TEST_REQUIRE_SLURM:-0}" = 1 ]; then
    echo "slurm_test: FAILED: cannot run a Slurm cluster here (LAUNCH_TEST_REQUIRE_SLURM=1): $1" >&2
    exit 1
  fi
  echo "slurm_test: SKIPPED: cannot run a Slurm cluster here: $1"
  exit 77
}

for f in "$launch" "$train"; do
  [ -x "$f" ] || { echo "slurm_test: $f: not an executable" >&2; exit 2; }
done
sl_preflight || skip "$SL_WHY"

t_start=$SECONDS
if ! sl_up 2; then
  dump_on_exit=1
  echo "slurm_test: FAILED: the cluster did not come up" >&2
  exit 1
fi
sl_log "cluster up in $((SECONDS - t_start)) s: slurmctld, ${SL_NODES[*]} idle (KillWait=$SL_KILL_WAIT s)"
w=$SL_TMP/work

# srun propagates the environment: every launch of a step gets the same token.
LAUNCH_RDZV_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export LAUNCH_RDZV_TOKEN

# The task srun runs: launch itself, or (LAUNCH_SLURM_EXPLICIT_FLAGS=1) launch given the step's
# topology as flags by a wrapper that execs it, so signals reach launch the same way.
task=("$launch")
if [ "${LAUNCH_SLURM_EXPLICIT_FLAGS:-0}" = 1 ]; then
  cat > "$w/launch-explicit.sh" << EOF
#!/bin/bash
first=\$(scontrol show hostnames "\$SLURM_STEP_NODELIST" | head -n 1)
exec "$launch" --nnodes="\$SLURM_STEP_NUM_NODES" --node-rank="\$SLURM_NODEID" \\
  --rdzv-endpoint="\$first:29400" --rdzv-id="\$SLURM_JOB_ID.\$SLURM_STEP_ID" "\$@"
EOF
  chmod +x "$w/launch-explicit.sh"
  task=("$w/launch-explicit.sh")
  sl_log "LAUNCH_SLURM_EXPLICIT_FLAGS=1: launch gets --nnodes, --node-rank, --rdzv-endpoint, --rdzv-id from a wrapper"
fi

# srun_to OUT CMD...: CMD in the hub namespace, its output in OUT, run in the background so that
# a signal to this script is handled at once (the trap tears everything down, srun included);
# returns CMD's status.
srun_to() {
  local out=$1
  shift
  sl_run "$@" > "$out" 2>&1 &
  wait $!
}

fail() {  # fail CASE WHY [OUTPUT_FILE]
  echo "slurm_test: FAILED: $1: $2" >&2
  if [ -n "${3:-}" ] && [ -f "$3" ]; then
    echo "---- $1's output ----" >&2
    cat "$3" >&2
  fi
  failures+=("$1")
  dump_on_exit=1
}
expect_line() {  # expect_line CASE FILE REGEX WHAT: FILE has a line matching REGEX
  grep -Eq -- "$3" "$2" || { fail "$1" "no line shows $4 (/$3/)" "$2"; return 1; }
}
# Processes named launch or train_mlp still alive in any node's namespace ("pid name" lines).
leftovers() {
  local n pid comm
  for n in "${SL_NODES[@]}"; do
    for pid in $(sl_node_pids "$n"); do
      comm=$(cat "/proc/$pid/comm" 2> /dev/null) || continue
      case $comm in launch | train_mlp) echo "$n: pid $pid $comm" ;; esac
    done
  done
}
no_leftovers() { [ -z "$(leftovers)" ]; }
# Global rank 0's lines: "[0]:" on one node, "[<host>:0]:" when the job spans nodes.
r0='^\[([A-Za-z0-9._-]+:)?0\]:'


# ---- 1: two nodes of two workers train to the end ----
c=train
t=$SECONDS
out=$w/$c.out
srun_to "$out" timeout 180 srun -N2 --ntasks-per-node=1 -J "$c" "${task[@]}" --nproc-per-node=2 \
  "$train" --steps 40 --checkpoint-dir "$w/ckpt-$c" --checkpoint-every 10
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "$c" "srun exited $rc, expected 0" "$out"
else
  expect_line "$c" "$out" "$r0"'train_mlp: world 4, ' "a world of 4 (2 nodes x 2 workers)" &&
    expect_line "$c" "$out" "$r0"'done: steps=40 ' "the final step 40" &&
    expect_line "$c" "$out" 'round 1: starting 2 worker\(s\), ranks 2-3 of world size 4 \(node 1 of 2\)' "node 1 running ranks 2-3" &&
    { [ -n "$(find "$w/ckpt-$c" -maxdepth 1 -regex '.*/ckpt-0*40\..*')" ] ||
      fail "$c" "no checkpoint of step 40 in $w/ckpt-$c: $(find "$w/ckpt-$c" | tr '\n' ' ')" "$out"; }
fi
sl_log "$c: $((SECONDS - t)) s"

# ---- 2: a worker on the second node dies; one restart, resumed from the checkpoint ----
c=restart
t=$SECONDS
out=$w/$c.out
srun_to "$out" timeout 180 srun -N2 --ntasks-per-node=1 -J "$c" "${task[@]}" --nproc-per-node=2 --max-restarts=1 \
  "$train" --steps 40 --checkpoint-dir "$w/ckpt-$c" --checkpoint-every 10 --fail-at-step 15 --fail-rank 3
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "$c" "srun exited $rc, expected 0" "$out"
else
  # Both nodes may see the failure first (rank 3 killed; rank 0's gloo read error) and each log
  # "restarting the group (1 of 1 restarts)"; one restart is one new round, joined by both.
  rounds2=$(grep -Ec 'round 2: starting 2 worker\(s\), ranks [0-3]-[0-3] of world size 4 .*restart 1/1' "$out")
  expect_line "$c" "$out" 'fault injection: rank 3 kills itself at step 15' "rank 3's death at step 15" &&
    expect_line "$c" "$out" 'restarting the group \(1 of 1 restarts\)' "the restart" &&
    expect_line "$c" "$out" "$r0"'resumed from step 10 ' "the restart resuming from step 10" &&
    expect_line "$c" "$out" "$r0"'done: steps=40 ' "the final step 40" &&
    { [ "$rounds2" -eq 2 ] || fail "$c" "$rounds2 nodes started round 2 as restart 1/1, expected 2" "$out"; } &&
    { ! grep -Eq 'round 3|\(2 of ' "$out" || fail "$c" "more than one restart" "$out"; }
fi
sl_log "$c: $((SECONDS - t)) s"

# ---- 3 and 4: scancel stops a running job: every worker and launch itself within the grace
# (KillWait: Slurm's SIGKILL comes after it), srun or the batch job ends, nothing is left ----
secs_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
before_kill_wait() { awk -v t="$1" -v k="$SL_KILL_WAIT" 'BEGIN { exit !(t < k - 1) }'; }
no_workers() { ! leftovers | grep -q ' train_mlp$'; }
job_gone() { ! sl_run squeue -h -j "$1" 2> /dev/null | grep -q .; }
# check_stop CASE OUTPUT T0 ENDED_AFTER WORKERS_AFTER: the verdicts common to both cases.
check_stop() {
  local c=$1 out=$2 ended=$4 workers=$5
  if [ "$workers" = never ]; then
    fail "$c" "workers still running $SL_KILL_WAIT s (KillWait) after scancel: $(leftovers | tr '\n' ';')" "$out"
  elif ! before_kill_wait "$ended"; then
    fail "$c" "the job ended $ended s after scancel, not before KillWait ($SL_KILL_WAIT s) ran out: Slurm had to SIGKILL what was left ($(grep -E 'task [0-9]+: Killed' "$out" | tr '\n' ';'))" "$out"
  elif grep -Eq 'task [0-9]+: Killed' "$out"; then
    fail "$c" "a task was SIGKILLed ($(grep -E 'task [0-9]+: Killed' "$out" | tr '\n' ';')): launch did not end within the grace" "$out"
  elif ! sl_wait_for 10 "$c: no launch or train_mlp left in the namespaces" no_leftovers; then
    fail "$c" "processes left after the job ended: $(leftovers | tr '\n' ';')" "$out"
  else
    expect_line "$c" "$out" 'task [0-9]+: Exited with exit code 143' "launch exiting 128+SIGTERM"
  fi
}

c=scancel
t=$SECONDS
out=$w/$c.out
sl_run timeout 180 srun -N2 --ntasks-per-node=1 -J "$c" "${task[@]}" --nproc-per-node=2 \
  "$train" --steps 1000000 --print-every 5 > "$out" 2>&1 &
srun_pid=$!
if ! sl_wait_for 90 "$c: step 10 of the training" grep -Eq "$r0"'step 10 ' "$out"; then
  fail "$c" "the training did not reach step 10" "$out"
  kill "$srun_pid" 2> /dev/null
  wait "$srun_pid"
else
  job=$(sl_run squeue -h -n "$c" -o %i)
  t0=$(date +%s.%N)
  sl_run scancel "$job"
  workers=never
  sl_wait_for "$SL_KILL_WAIT" "$c: every train_mlp gone" no_workers && workers=$(secs_since "$t0")
  wait "$srun_pid"
  rc=$?
  ended=$(secs_since "$t0")
  sl_log "$c: after scancel $job: workers gone at $workers s, srun ended at $ended s (exit $rc)"
  check_stop "$c" "$out" "$t0" "$ended" "$workers"
fi
sl_log "$c: $((SECONDS - t)) s"

c=sbatch-scancel
t=$SECONDS
out=$w/$c.out
cat > "$w/$c.sh" << EOF
#!/bin/bash
srun ${task[*]} --nproc-per-node=2 $train --steps 1000000 --print-every 5
EOF
job=$(sl_run sbatch --parsable -N2 --ntasks-per-node=1 -J "$c" -o "$out" "$w/$c.sh")
if [ -z "$job" ]; then
  fail "$c" "sbatch gave no job id"
elif ! sl_wait_for 90 "$c: step 10 of the training" grep -Eq "$r0"'step 10 ' "$out"; then
  fail "$c" "the training did not reach step 10" "$out"
  sl_run scancel "$job"
else
  t0=$(date +%s.%N)
  sl_run scancel "$job"
  workers=never
  sl_wait_for "$SL_KILL_WAIT" "$c: every train_mlp gone" no_workers && workers=$(secs_since "$t0")
  if sl_wait_for $((SL_KILL_WAIT + 30)) "$c: job $job to leave the queue" job_gone "$job"; then
    ended=$(secs_since "$t0")
    sl_log "$c: after scancel $job: workers gone at $workers s, the job left the queue at $ended s"
    check_stop "$c" "$out" "$t0" "$ended" "$workers"
  else
    fail "$c" "job $job still in the queue $((SL_KILL_WAIT + 30)) s after scancel" "$out"
  fi
fi
sl_log "$c: $((SECONDS - t)) s"

if ((${#failures[@]})); then
  echo "slurm_test: FAILED: ${failures[*]} ($((SECONDS - t_start)) s)" >&2
  exit 1
fi
echo "slurm_test: all 4 cases passed in $((SECONDS - t_start)) s"
