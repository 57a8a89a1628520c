#!/usr/bin/env bash
# rendezvous_bench with the coordinator's state in etcd: three etcd members on 127.0.0.1 in a
# network namespace of this script's own (so their fixed ports collide with nothing), then
# rendezvous_bench --state etcd://... with the arguments given (--failover, --agents ...).
# Usage (as root): bench/etcd_bench.sh BUILD_DIR [rendezvous_bench flags...]
set -euo pipefail
if [ "${1:-}" = "--in-netns" ]; then
  shift
  build=$1
  shift
  ip link set lo up
  data=$(mktemp -d)
  trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$data"' EXIT
  cluster=m0=http://127.0.0.1:2380,m1=http://127.0.0.1:12380,m2=http://127.0.0.1:22380
  for i in 0 1 2; do
    client=http://127.0.0.1:$((2379 + 10000 * i))
    peer=http://127.0.0.1:$((2380 + 10000 * i))
    etcd --name "m$i" --data-dir "$data/m$i" --listen-client-urls "$client" --advertise-client-urls "$client" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "$cluster" \
      --initial-cluster-state new --initial-cluster-token launch-bench >"$data/m$i.log" 2>&1 &
  done
  endpoints=127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379
  for _ in $(seq 1 100); do
    ETCDCTL_API=3 etcdctl --endpoints "$endpoints" endpoint health >/dev/null 2>&1 && break
    sleep 0.2
  done
  "$build/bin/rendezvous_bench" "$build/bin/launch" --state "etcd://$endpoints" "$@"
  exit
fi
build=${1:?usage: etcd_bench.sh BUILD_DIR [rendezvous_bench flags...]}
shift
exec unshare -n -- bash "$0" --in-netns "$build" "$@"
