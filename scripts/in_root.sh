#!/usr/bin/env bash
# Runs a command inside a Debian root (from scripts/debian13_root.sh) with this repository at
# /src, /proc, /dev and /sys mounted. It runs in a private mount namespace, so every mount
# vanishes with the command, however it ends; nothing is left mounted on the host.
#   usage: in_root.sh ROOT [--bind HOST_DIR:ROOT_DIR]... -- COMMAND [ARGS...]
# The command gets a clean environment (PATH, HOME, LANG, CI, and the VAR=VALUE words given
# with --env), not the caller's.
set -euo pipefail
usage() { echo "usage: in_root.sh ROOT [--bind HOST_DIR:ROOT_DIR]... [--env VAR=VALUE]... -- COMMAND [ARGS...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
args=("$@")
root=$1
shift
[ -f "$root/.launch-root-complete" ] || { echo "in_root.sh: $root is not a finished root (scripts/debian13_root.sh makes one)" >&2; exit 2; }
binds=()
envs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --bind) [ $# -ge 2 ] || usage; binds+=("$2"); shift 2 ;;
    --env) [ $# -ge 2 ] || usage; envs+=("$2"); shift 2 ;;
    *) echo "in_root.sh: unknown option '$1'" >&2; usage ;;
  esac
done
[ $# -ge 2 ] || usage
shift
repo=$(cd "$(dirname "$0")/.." && pwd)

if [ "${LAUNCH_IN_ROOT_NS:-}" != "1" ]; then
  exec env LAUNCH_IN_ROOT_NS=1 unshare --mount --propagation private -- "$0" "${args[@]}"
fi

# The root a mount point of its own: `ip netns exec` (the network-namespace tests) remounts / as a slave.
mount --bind "$root" "$root"
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mkdir -p "$root/src"
mount --bind "$repo" "$root/src"
for b in "${binds[@]}"; do
  host=${b%%:*}
  inside=${b#*:}
  [ -e "$host" ] || { echo "in_root.sh: --bind $b: $host does not exist" >&2; exit 2; }
  mkdir -p "$root$inside"
  mount --bind "$host" "$root$inside"
done
exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 CI="${CI:-}" "${envs[@]}" "$@"
