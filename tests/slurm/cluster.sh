# shellcheck shell=bash disable=SC2034  # sourced; SL_* are read by the scripts that source it
# A real Slurm (Debian's slurmctld, slurmd, munged) on this one machine, for tests: sourced by
# slurm_test.sh and explore.sh. Each slurmd "node" lives in a network namespace of its own (and a
# UTS namespace, so its host name is its node name), joined by a veth pair to a bridge in a hub
# namespace that also holds munged, slurmctld (host name slurmctl) and every client command
# (srun, sbatch, sinfo, ...). Addresses are 10.213.0.0/24, all made here, inside namespaces made
# here: nothing is added to the machine's own network namespace, and /etc/hosts is not touched
# (`ip netns exec NS` bind-mounts /etc/netns/NS/hosts over it, which we write). Everything else
# (munge key, slurm.conf, spool, state, logs) is in one temporary directory.
#
#   sl_preflight            -> 0, or 1 with the reason in SL_WHY (packages missing, not root,
#                              namespaces cannot be made)
#   sl_up N                 cluster with node01..nodeN, every node idle (or fails with the logs)
#   sl_run CMD...           CMD in the hub namespace with SLURM_CONF set (srun, sbatch, ...)
#   sl_node_pids NODE       pids of every process in NODE's namespace
#   sl_down                 kills every process of every namespace, deletes namespaces (veths and
#                           the bridge go with them), /etc/netns/<ns>, the temporary directory
#
# Names carry this shell's pid (lsl<pid>-hub, lsl<pid>-node01), so runs side by side never meet;
# sl_up first removes what a run that was killed with SIGKILL (a ctest timeout) left behind.

# The daemons and ip live in sbin, which a non-login root shell may not have on its PATH.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/sbin:/sbin ;; esac
SL_SUBNET=10.213.0
SL_CTL_ADDR=$SL_SUBNET.1
SL_TAG=lsl$$
SL_HUB=$SL_TAG-hub
SL_TMP=
SL_NODES=()
SL_MADE_NS=()
SL_DAEMONS=()  # "name pid" of munged, slurmctld, each slurmd
SL_WHY=
# KillWait: the grace between SIGTERM and SIGKILL when a job or step is cancelled or times out.
SL_KILL_WAIT=${SL_KILL_WAIT:-20}

sl_log() { echo "slurm_test: $*" >&2; }

sl_ns() { echo "$SL_TAG-$1"; }
sl_node_addr() { echo "$SL_SUBNET.$((10 + 10#${1#node}))"; }

# A deadline-bounded wait: sl_wait_for SECONDS DESCRIPTION CMD... polls CMD every 0.2 s.
sl_wait_for() {
  local secs=$1 what=$2
  shift 2
  local end=$((SECONDS + secs))
  until "$@" > /dev/null 2>&1; do
    if ((SECONDS >= end)); then
      sl_log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

sl_preflight() {
  if [ "$(id -u)" -ne 0 ]; then
    SL_WHY="needs root (network namespaces, daemons as root)"
    return 1
  fi
  local missing=() c
  for c in slurmctld slurmd slurmstepd srun sbatch sinfo squeue scancel scontrol munged mungekey ip unshare; do
    command -v "$c" > /dev/null 2>&1 || missing+=("$c")
  done
  if ((${#missing[@]})); then
    SL_WHY="missing ${missing[*]} (apt-get install slurmctld slurmd slurm-client munge iproute2 util-linux)"
    return 1
  fi
  local probe=$SL_TAG-probe
  if ! ip netns add "$probe" 2> /dev/null; then
    SL_WHY="cannot create a network namespace (ip netns add failed: no CAP_SYS_ADMIN or no netns support)"
    return 1
  fi
  local ok=1
  ip -n "$probe" link add "${SL_TAG}a" type veth peer name "${SL_TAG}b" 2> /dev/null || ok=0
  ((ok)) && { ip netns exec "$probe" unshare --uts true 2> /dev/null || ok=0; }
  ip netns del "$probe" 2> /dev/null
  if ((!ok)); then
    SL_WHY="cannot make veth pairs or UTS namespaces inside a network namespace"
    return 1
  fi
  return 0
}

# Namespaces lsl<pid>-* whose pid is gone: a run killed before its trap could run.
sl_reap_stale() {
  local ns pid
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E '^lsl[0-9]+-' || true); do
    pid=${ns#lsl}
    pid=${pid%%-*}
    [ -d "/proc/$pid" ] && continue
    sl_log "removing namespace $ns left by an earlier run (pid $pid, gone)"
    sl_kill_ns "$ns"
    ip netns del "$ns" 2> /dev/null
    rm -rf "/etc/netns/$ns"
  done
}

# Every process in the namespaces given: SIGTERM, up to 5 s for all of them, then SIGKILL, up to
# 5 s more (a launch that lingers, a slurmd waiting for its steps).
sl_ns_pids() {
  local ns
  for ns in "$@"; do ip netns pids "$ns" 2> /dev/null; done
}
sl_kill_ns() {
  local pids sig end
  for sig in TERM KILL; do
    pids=$(sl_ns_pids "$@")
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086  # one pid a word
    kill -$sig $pids 2> /dev/null
    end=$((SECONDS + 5))
    while [ -n "$(sl_ns_pids "$@")" ] && ((SECONDS < end)); do sleep 0.1; done
  done
  pids=$(sl_ns_pids "$@")
  [ -z "$pids" ] || sl_log "still alive after SIGKILL in namespaces $*: $pids"
}

sl_node_pids() { ip netns pids "$(sl_ns "$1")" 2> /dev/null; }

sl_run() { ip netns exec "$SL_HUB" env SLURM_CONF="$SL_TMP/etc/slurm.conf" "$@"; }

sl_make_ns() {
  local ns=$1
  ip netns add "$ns" || return 1
  SL_MADE_NS+=("$ns")
  ip -n "$ns" link set lo up
}

sl_write_hosts() {
  local ns=$1 n
  mkdir -p "/etc/netns/$ns"
  {
    echo "127.0.0.1 localhost"
    echo "$SL_CTL_ADDR slurmctl"
    for n in "${SL_NODES[@]}"; do echo "$(sl_node_addr "$n") $n"; done
  } > "/etc/netns/$ns/hosts"
}

sl_write_conf() {
  local t=$SL_TMP n nodes
  nodes=$(IFS=,; echo "${SL_NODES[*]}")
  cat > "$t/etc/slurm.conf" << EOF
ClusterName=launchtest
SlurmctldHost=slurmctl($SL_CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$t/munge-socket/munge.socket
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$t/state
SlurmdSpoolDir=$t/spool/%n
SlurmctldPidFile=$t/run/slurmctld.pid
SlurmdPidFile=$t/run/slurmd-%n.pid
SlurmctldLogFile=$t/log/slurmctld.log
SlurmdLogFile=$t/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: processes are tracked by parentage, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# The nodes declare 4 CPUs whatever this machine has (config_overrides: slurmd does not drain a
# node whose hardware has fewer), so two tasks per node always fit.
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=$SL_KILL_WAIT
MinJobAge=60
InactiveLimit=0
MessageTimeout=10
SlurmdTimeout=60
SlurmctldTimeout=60
NodeName=DEFAULT CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
EOF
  # slurmd 22.05 loads a cgroup plugin whatever the other plugins are; v1's init() touches no
  # cgroup (only the cgroup plugins, not configured here, would), where autodetect fails: `ip
  # netns exec` mounts a fresh /sys with no /sys/fs/cgroup under it.
  echo "CgroupPlugin=cgroup/v1" > "$t/etc/cgroup.conf"
  for n in "${SL_NODES[@]}"; do
    echo "NodeName=$n NodeAddr=$(sl_node_addr "$n") NodeHostname=$n" >> "$t/etc/slurm.conf"
  done
  echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP" >> "$t/etc/slurm.conf"
}

# Fails, naming it, when a daemon has exited: what is waited for will not come.
sl_daemons_alive() {
  local d
  for d in "${SL_DAEMONS[@]}"; do
    if ! kill -0 "${d#* }" 2> /dev/null; then
      sl_log "${d% *} exited (its log: $SL_TMP/log/${d% *}.log)"
      return 1
    fi
  done
}

# sl_wait_up SECONDS DESCRIPTION CMD...: sl_wait_for that gives up at once when a daemon died.
sl_wait_up() {
  local secs=$1 what=$2
  shift 2
  local end=$((SECONDS + secs))
  until "$@" > /dev/null 2>&1; do
    sl_daemons_alive || return 1
    if ((SECONDS >= end)); then
      sl_log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.2
  done
}

sl_nodes_idle() {
  local out
  out=$(sl_run sinfo -h -N -o '%N %T' 2> /dev/null) || return 1
  [ "$(grep -c ' idle$' <<< "$out")" -eq "${#SL_NODES[@]}" ]
}

# The logs, for a failure.
sl_dump_logs() {
  [ -n "$SL_TMP" ] && [ -d "$SL_TMP/log" ] || return 0
  # *.log: the daemons' log files; *.out: their stderr, which also holds what failed before a
  # log file was opened (a bad slurm.conf, munged's checks).
  local f lines
  for f in "$SL_TMP"/log/*; do
    [ -s "$f" ] || continue
    case $f in *.out) lines=8 ;; *) lines=25 ;; esac
    echo "---- ${f#"$SL_TMP"/} (last $lines lines) ----" >&2
    tail -n "$lines" "$f" >&2
  done
}

sl_up() {
  local count=$1 i n ns
  sl_reap_stale
  SL_NODES=()
  for ((i = 1; i <= count; ++i)); do SL_NODES+=("$(printf 'node%02d' "$i")"); done
  SL_TMP=$(mktemp -d /tmp/launch-slurm.XXXXXX) || return 1
  # munged wants its socket's directory reachable by all, its key readable only by its owner.
  chmod 711 "$SL_TMP"
  mkdir -p "$SL_TMP"/{etc,state,run,log,munge,munge-socket,work} || return 1
  chmod 700 "$SL_TMP/munge"
  chmod 755 "$SL_TMP/munge-socket"
  chmod 777 "$SL_TMP/work"
  for n in "${SL_NODES[@]}"; do mkdir -p "$SL_TMP/spool/$n" && chmod 755 "$SL_TMP/spool/$n"; done
  sl_write_conf

  # The network: the hub's bridge at .1, node i at .(10+i).
  sl_make_ns "$SL_HUB" || return 1
  sl_write_hosts "$SL_HUB"
  ip -n "$SL_HUB" link add br0 type bridge || return 1
  ip -n "$SL_HUB" addr add "$SL_CTL_ADDR/24" dev br0 || return 1
  ip -n "$SL_HUB" link set br0 up || return 1
  i=0
  for n in "${SL_NODES[@]}"; do
    ns=$(sl_ns "$n")
    i=$((i + 1))
    sl_make_ns "$ns" || return 1
    sl_write_hosts "$ns"
    ip -n "$SL_HUB" link add "p$i" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$SL_HUB" link set "p$i" master br0 || return 1
    ip -n "$SL_HUB" link set "p$i" up || return 1
    ip -n "$ns" addr add "$(sl_node_addr "$n")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
  done

  mungekey -c -k "$SL_TMP/munge/munge.key" > "$SL_TMP/log/mungekey.log" 2>&1 || { cat "$SL_TMP/log/mungekey.log" >&2; return 1; }
  ip netns exec "$SL_HUB" munged -F --key-file="$SL_TMP/munge/munge.key" \
    --socket="$SL_TMP/munge-socket/munge.socket" --pid-file="$SL_TMP/munge/munged.pid" \
    --log-file="$SL_TMP/log/munged.log" --seed-file="$SL_TMP/munge/munged.seed" --origin="$SL_CTL_ADDR" \
    > "$SL_TMP/log/munged.out" 2>&1 < /dev/null &
  SL_DAEMONS+=("munged $!")
  disown  # sl_down ends every daemon; no job-control notice when it has to SIGKILL one
  sl_wait_up 20 "munged's socket" test -S "$SL_TMP/munge-socket/munge.socket" || return 1

  ip netns exec "$SL_HUB" unshare --uts env SLURM_CONF="$SL_TMP/etc/slurm.conf" \
    sh -c 'hostname slurmctl && exec slurmctld -D -i' > "$SL_TMP/log/slurmctld.out" 2>&1 < /dev/null &
  SL_DAEMONS+=("slurmctld $!")
  disown
  sl_wait_up 30 "slurmctld to answer (scontrol ping)" sh -c "ip netns exec '$SL_HUB' env SLURM_CONF='$SL_TMP/etc/slurm.conf' scontrol ping | grep -q UP" || return 1

  for n in "${SL_NODES[@]}"; do
    ip netns exec "$(sl_ns "$n")" unshare --uts env SLURM_CONF="$SL_TMP/etc/slurm.conf" \
      sh -c "hostname $n && exec slurmd -D -N $n" > "$SL_TMP/log/slurmd-$n.out" 2>&1 < /dev/null &
    SL_DAEMONS+=("slurmd-$n $!")
    disown
  done
  sl_wait_up 60 "every node idle in sinfo" sl_nodes_idle || { sl_run sinfo -N >&2; return 1; }
}

sl_down() {
  local ns i
  ((${#SL_MADE_NS[@]})) && sl_kill_ns "${SL_MADE_NS[@]}"
  for ((i = ${#SL_MADE_NS[@]} - 1; i >= 0; --i)); do
    ns=${SL_MADE_NS[i]}
    ip netns del "$ns" 2> /dev/null
    rm -rf "/etc/netns/$ns"
  done
  SL_MADE_NS=()
  SL_DAEMONS=()
  if [ -n "$SL_TMP" ]; then
    rm -rf "$SL_TMP"
    SL_TMP=
  fi
}
