#!/usr/bin/env bash
# What a real Slurm gives a job, found by experiment on the cluster of cluster.sh (run by hand as
# root, not a test; about 2.5 minutes): the SLURM_* variables of job steps and of a batch script,
# and which signals tasks get, when, on scancel, scancel --signal and sbatch --signal=SIG@N.
#   bash tests/slurm/explore.sh [all|env|signals|timelimit]
# Prints raw `env | grep ^SLURM` dumps and, per experiment, each task's received signals with
# their times relative to the moment of the scancel (or the job's start, for the time limit).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SL_KILL_WAIT=${SL_KILL_WAIT:-10}
# shellcheck source=cluster.sh
source "$here/cluster.sh"
what=${1:-all}

trap 'sl_down' EXIT
trap 'exit 130' INT TERM HUP
sl_preflight || { echo "explore.sh: cannot run: $SL_WHY" >&2; exit 1; }
sl_up 2 || { sl_dump_logs; exit 1; }
w=$SL_TMP/work
sl_log "cluster up: ${SL_NODES[*]}, KillWait=$SL_KILL_WAIT"

dump() {  # the sorted SLURM_ variables of one task, under a header naming it
  cat > "$w/dump.sh" << 'EOF'
#!/bin/bash
{ echo "== $1: $(hostname) SLURM_PROCID=${SLURM_PROCID-unset}"; env | grep ^SLURM | sort; } > "$2.$(hostname).${SLURM_PROCID-batch}"
EOF
  chmod +x "$w/dump.sh"
}

if [ "$what" = all ] || [ "$what" = env ]; then
  dump
  echo "######## (a) srun -N2 --ntasks-per-node=1"
  sl_run srun -N2 --ntasks-per-node=1 "$w/dump.sh" a "$w/env-a"
  cat "$w"/env-a.*
  echo "######## (b) srun -N2 --ntasks-per-node=2"
  sl_run srun -N2 --ntasks-per-node=2 "$w/dump.sh" b "$w/env-b"
  cat "$w"/env-b.*
  echo "######## (c) sbatch -N2 --ntasks-per-node=1: the batch script's own shell, then a step inside it"
  cat > "$w/batch.sh" << EOF
#!/bin/bash
$w/dump.sh c-batch-body $w/env-c
srun $w/dump.sh c-step-in-batch $w/env-cs
EOF
  job=$(sl_run sbatch --parsable -N2 --ntasks-per-node=1 -o "$w/batch.out" "$w/batch.sh")
  sl_wait_for 60 "batch job $job to end" sh -c "! ip netns exec $SL_HUB env SLURM_CONF=$SL_TMP/etc/slurm.conf squeue -h -j $job | grep -q ."
  cat "$w"/env-c.* "$w"/env-cs.*
  echo "######## (d) salloc -N2 --ntasks-per-node=1 CMD: CMD, run by salloc where salloc runs (here the hub namespace, host name vm)"
  sl_run salloc -N2 --ntasks-per-node=1 "$w/dump.sh" d-salloc-shell "$w/env-d" 2> /dev/null
  cat "$w"/env-d.*
fi

# A task that logs every catchable signal it gets (time, name) and a heartbeat every 0.1 s (so
# the moment of a SIGKILL is its last heartbeat), and ignores all of them: what Slurm does next
# shows. The bash traps run between short sleeps.
probe() {
  cat > "$w/probe.sh" << 'EOF'
#!/bin/bash
# The batch script's shell has SLURM_PROCID=0 too, but no SLURM_STEP_ID.
if [ -n "${SLURM_STEP_ID+set}" ]; then log=$1.$(hostname).$SLURM_PROCID; else log=$1.$(hostname).batch; fi
now() { date +%s.%N; }
for s in HUP INT QUIT USR1 USR2 TERM CONT ALRM XCPU; do trap "echo \"\$(now) SIG$s\" >> $log" $s; done
echo "$(now) start pid=$$" >> "$log"
# A child in a session (and process group) of its own, as launch starts its workers: does Slurm
# signal it too, or only the task?
[ "${2-}" = child ] || (exec setsid "$0" "$1.child-setsid" child < /dev/null) &
# The child's parent is an intermediate subshell, with no traps, that a signal ends: the child
# is then reparented to pid 1 (slurmstepd is no subreaper), where proctrack/linuxproc no longer
# finds it, and would keep the job COMPLETING for ever. It says so and leaves.
ppid0=$PPID
ppid() { local pid comm state pp rest; read -r pid comm state pp rest < /proc/$$/stat; echo "$pp"; }
while :; do
  echo "$(now) alive" >> "$log.alive"
  if [ "${2-}" = child ] && [ "$(ppid)" != "$ppid0" ]; then
    echo "$(now) orphaned:reparented-to-pid-$(ppid),-exits" >> "$log"
    rm -f "$log.alive"
    exit 0
  fi
  sleep 0.1
done
EOF
  chmod +x "$w/probe.sh"
}

report() {  # report T0 PREFIX: the signals in the logs PREFIX.*, seconds after T0; the last heartbeat
  local t0=$1 f
  for f in "$2".*; do
    case $f in *.alive) continue ;; esac
    echo "  ${f##*/}:"
    awk -v t0="$t0" '$2 != "" && $2 !~ /^pid/ {printf "    %+7.2f s  %s\n", $1 - t0, $2}' "$f"
    [ -f "$f.alive" ] && tail -n 1 "$f.alive" | awk -v t0="$t0" '{printf "    %+7.2f s  last heartbeat (killed after it)\n", $1 - t0}'
  done
}

wait_started() {  # wait_started PREFIX COUNT: COUNT probe logs exist
  sl_wait_for 30 "$2 probe task(s) to start" sh -c "[ \$(ls $1.* 2>/dev/null | grep -v -e alive -e child | wc -l) -ge $2 ]"
  sleep 0.5  # the traps are set before "start" is written; let both tasks reach their loop
}

job_gone() { ! sl_run squeue -h -j "$1" 2> /dev/null | grep -q .; }

if [ "$what" = all ] || [ "$what" = signals ]; then
  probe
  echo "######## (e) srun -N2 (a job of its own), then scancel JOB"
  sl_run srun -N2 --ntasks-per-node=1 -J probe-e "$w/probe.sh" "$w/sig-e" > "$w/srun-e.out" 2>&1 &
  spid=$!
  wait_started "$w/sig-e" 2
  job=$(sl_run squeue -h -n probe-e -o %i)
  t0=$(date +%s.%N)
  sl_run scancel "$job"
  wait "$spid"
  echo "  srun exited $? after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}') s; its output:"
  sed 's/^/    /' "$w/srun-e.out"
  report "$t0" "$w/sig-e"

  echo "######## (f) srun -N2, then scancel --signal=USR1 JOB (then a plain scancel)"
  sl_run srun -N2 --ntasks-per-node=1 -J probe-f "$w/probe.sh" "$w/sig-f" > "$w/srun-f.out" 2>&1 &
  spid=$!
  wait_started "$w/sig-f" 2
  job=$(sl_run squeue -h -n probe-f -o %i)
  t0=$(date +%s.%N)
  sl_run scancel --signal=USR1 "$job"
  sleep 2
  echo "  2 s after scancel --signal=USR1, the job is: $(sl_run squeue -h -j "$job" -o %T)"
  sl_run scancel "$job"
  wait "$spid"
  report "$t0" "$w/sig-f"

  echo "######## (g) sbatch: the batch shell and an srun step both probe; scancel --signal=USR1 JOB, then --full --signal=USR2, then scancel JOB"
  cat > "$w/batch-g.sh" << EOF
#!/bin/bash
srun $w/probe.sh $w/sig-g &
exec $w/probe.sh $w/sig-g
EOF
  job=$(sl_run sbatch --parsable -N2 --ntasks-per-node=1 -o "$w/batch-g.out" "$w/batch-g.sh")
  wait_started "$w/sig-g" 3
  t0=$(date +%s.%N)
  sl_run scancel --signal=USR1 "$job"
  sleep 1
  sl_run scancel --full --signal=USR2 "$job"
  sleep 1
  sl_run scancel "$job"
  sl_wait_for $((SL_KILL_WAIT + 30)) "job $job to end" job_gone "$job"
  report "$t0" "$w/sig-g"
fi

if [ "$what" = all ] || [ "$what" = timelimit ]; then
  probe
  echo "######## (h) sbatch --time=1 --signal=USR1@40 (steps), and beside it --signal=B:USR1@40 (batch shell); the limit is 60 s"
  for j in h hb; do
    cat > "$w/batch-$j.sh" << EOF
#!/bin/bash
srun $w/probe.sh $w/sig-$j &
exec $w/probe.sh $w/sig-$j
EOF
  done
  t0=$(date +%s.%N)
  job=$(sl_run sbatch --parsable -N2 --ntasks-per-node=1 --time=1 --signal=USR1@40 -o "$w/batch-h.out" "$w/batch-h.sh")
  jobb=$(sl_run sbatch --parsable -N2 --ntasks-per-node=1 --time=1 --signal=B:USR1@40 -o "$w/batch-hb.out" "$w/batch-hb.sh")
  sl_wait_for $((150 + SL_KILL_WAIT)) "job $job to end at its time limit" job_gone "$job"
  sl_wait_for 30 "job $jobb to end at its time limit" job_gone "$jobb"
  echo "  --signal=USR1@40 (times from sbatch):"
  report "$t0" "$w/sig-h"
  echo "  --signal=B:USR1@40:"
  report "$t0" "$w/sig-hb"
  echo "  batch output (USR1@40):"
  sed 's/^/    /' "$w/batch-h.out"
fi
