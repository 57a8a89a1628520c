#!/usr/bin/env bash
# Makes launch's Debian packages with CPack in a build directory, installs them with apt-get in
# a fresh Debian 12 root (apt fetches what they depend on from Debian's archive) and checks what
# they installed: launch runs, its man page, bash completion and Python module are found, a user
# project builds against the installed SDK and runs under the installed launch, and purging the
# packages removes them. One line per check; exits 1 when any fails.
#   usage: scripts/test_package.sh BUILD_DIR      (built: scripts/test.sh builds build/)
# The packages are left in BUILD_DIR/packages. The base root (mmdebstrap --variant=apt bookworm
# with the tools the checks use, and no launch) is made once and cached in
# LAUNCH_ROOT_CACHE (/var/cache/launch)/bookworm-<hash of its package list>, the .debs apt
# downloads beside it. Each run works on a throwaway overlay of the base root, in a private
# mount namespace and PID namespace: the mounts vanish and every process is killed with it,
# however it ends, and its files are removed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
me=test_package.sh

# ---- Inside the root (third stage): the checks. ---------------------------------------------
if [ "${1:-}" = "--stage=root" ]; then
  failures=0
  log=/tmp/check.log
  # check NAME COMMAND...: one line, "ok" with the command's last line of output, or "FAIL" with
  # the end of its output. COMMAND runs in a subshell with errexit on (in an `if` it would be
  # off), so any step of it that fails fails the check.
  check() {
    local name=$1 start=$SECONDS rc=0
    shift
    set +e
    (set -e; "$@") >"$log" 2>&1
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
      printf 'ok   %-11s %s (%ds)\n' "$name" "$(tail -n 1 "$log")" $((SECONDS - start))
    else
      printf 'FAIL %-11s (exit %d)\n' "$name" "$rc"
      sed 's/^/       | /' "$log" | tail -n 25
      failures=$((failures + 1))
    fi
  }
  # expect WHAT TEXT PATTERN: fails naming WHAT unless TEXT has a line matching PATTERN (grep -E).
  expect() {
    grep -qE -- "$3" <<<"$2" || { printf '%s\n' "$2"; echo "$me: $1: no line matching '$3'"; return 1; }
  }

  # Without Recommends, so Depends alone must carry both packages; dpkg without fsync (a
  # throwaway root) and man-db without its index (man finds pages without it): half the time.
  install_packages() {
    local before after
    before=$(dpkg-query -W -f '${Package}\n' | wc -l)
    echo 'man-db man-db/auto-update boolean false' | debconf-set-selections
    apt-get update -q
    apt-get install -y -q --no-install-recommends -o APT::Keep-Downloaded-Packages=true \
      -o Dpkg::Options::=--force-unsafe-io /debs/launch_*.deb /debs/launch-sdk-dev_*.deb
    after=$(dpkg-query -W -f '${Package}\n' | wc -l)
    dpkg-query -W -f '${Package} ${Version} ${Status}\n' launch launch-sdk-dev
    echo "apt-get installed launch $(dpkg-query -W -f '${Version}' launch) and launch-sdk-dev, with $((after - before - 2)) packages from Debian's archive"
  }
  version() {
    local out want
    out=$(launch --version)
    want="launch $(dpkg-query -W -f '${Version}' launch | sed 's/-[^-]*$//')"
    [ "$out" = "$want" ] || { echo "launch --version printed '$out', expected '$want'"; return 1; }
    echo "$(command -v launch): $out"
  }
  run_true() {
    timeout 120 launch --nproc-per-node=2 --no-python /bin/true
    echo "launch --nproc-per-node=2 --no-python /bin/true: exit 0"
  }
  man_page() {
    local path text
    path=$(man -w launch)
    [ "$path" = /usr/share/man/man1/launch.1.gz ] || { echo "man -w launch: '$path'"; return 1; }
    text=$(MANWIDTH=100 MANPAGER=cat man launch 2>&1)
    expect "man launch" "$text" '^ +--nproc-per-node,--nproc_per_node'
    expect "man launch" "$text" '^ +launch coordinator$'
    expect "man launch" "$text" '^ +launch doctor$'
    echo "man -w launch: $path, with the flags and subcommands"
  }
  # What bash-completion does on `launch <TAB>`: load the file, then call its function with the
  # line (COMP_WORDS split on blanks: the lines below have no = or :).
  completion() {
    bash --norc --noprofile -c '
      . /usr/share/bash-completion/bash_completion
      _completion_loader launch
      spec=$(complete -p launch) || exit 1
      [[ $spec == "complete -F _launch launch" ]] || { echo "complete -p launch: $spec"; exit 1; }
      echo "$spec"
      # complete LINE EXPECTED_WORD...: the replies to LINE<TAB> include every EXPECTED_WORD.
      # A word prefixed with ! must not be among them.
      complete_line() {
        local line=$1 w
        shift
        COMP_LINE=$line COMP_POINT=${#line}
        read -ra COMP_WORDS <<<"$line"
        [[ $line == *" " ]] && COMP_WORDS+=("")
        COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
        COMPREPLY=()
        _launch launch "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
        local got=" ${COMPREPLY[*]} "
        for w in "$@"; do
          if [[ $w == !* ]]; then
            [[ $got != *" ${w#!} "* ]] || { echo "launch completion: \"$line<TAB>\" offers ${w#!}:$got"; exit 1; }
          else
            [[ $got == *" $w "* ]] || { echo "launch completion: \"$line<TAB>\" gives$got, not $w"; exit 1; }
          fi
        done
      }
      complete_line "launch --nproc" --nproc-per-node
      complete_line "launch --nproc_p" --nproc_per_node
      complete_line "launch " coordinator status doctor
      complete_line "launch --rdzv-backend " c10d static
      complete_line "launch --nproc-per-node " auto cpu gpu
      complete_line "launch coordinator --" --listen --tls-cert !--nnodes
      complete_line "launch doctor --j" --json
      complete_line "launch --nnodes 2 /bin/true --" !--nnodes !--nproc-per-node
      echo "launch --nproc<TAB>: --nproc-per-node; launch <TAB>: coordinator status doctor; and 6 more"
    '
  }
  python_module() {
    local file
    file=$(cd / && python3 -c 'import launch_progress; print(launch_progress.__file__)')
    [ "$file" = /usr/lib/python3/dist-packages/launch_progress.py ] || { echo "imported $file"; return 1; }
    echo "python3 -c 'import launch_progress': $file"
  }
  # A Python worker reporting progress through the module launch puts on its PYTHONPATH.
  python_worker() {
    local out
    cat >/tmp/progress_worker.py <<'EOF'
import os
import launch_progress
launch_progress.Reporter().step(1, 0.5)
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "reported from", launch_progress.__file__)
EOF
    # This root's python3 has no torch (launch does not depend on it): the worker needs none, so
    # PYTHON_EXEC says to run it there anyway.
    out=$(cd /tmp && PYTHON_EXEC=python3 timeout 120 launch --nproc-per-node=2 /tmp/progress_worker.py)
    printf '%s\n' "$out"
    expect "python worker" "$out" '^\[0\]:rank 0 of 2 reported from /usr/share/launch/python/launch_progress.py$'
    expect "python worker" "$out" '^\[1\]:rank 1 of 2 reported from '
    echo "launch --nproc-per-node=2 progress_worker.py: 2 ranks reported progress"
  }
  # The README and every file of the tree it links to (docs/*.md, bench/README.md), beside it.
  docs() {
    local dir=/usr/share/doc/launch link missing=() n=0
    [ -s $dir/README.md ] || { echo "no $dir/README.md"; return 1; }
    [ -s $dir/docs/cli.md ] || { echo "no $dir/docs/cli.md"; return 1; }
    for link in $(grep -oE '\]\([^)#: ]+' $dir/README.md | cut -c3- | sort -u); do
      n=$((n + 1))
      [ -s "$dir/$link" ] || missing+=("$link")
    done
    [ ${#missing[@]} -eq 0 ] || { echo "$dir/README.md links to files not installed: ${missing[*]}"; return 1; }
    echo "$dir/README.md and the $n files it links to"
  }
  # examples/external_project: find_package(LaunchSDK) finds the package's config under /usr.
  sdk_project() {
    local out
    cmake -S /src/examples/external_project -B /tmp/ext -G Ninja -DCMAKE_BUILD_TYPE=Release
    grep -E '^LaunchSDK_DIR:' /tmp/ext/CMakeCache.txt
    grep -qE '^LaunchSDK_DIR:PATH=/usr/lib/cmake/LaunchSDK$' /tmp/ext/CMakeCache.txt
    cmake --build /tmp/ext
    out=$(cd /tmp && timeout 300 launch --nproc-per-node=2 /tmp/ext/allreduce_hello)
    printf '%s\n' "$out"
    expect "allreduce_hello" "$out" '^\[0\]:rank 0 of 2 on gloo: allreduce=3$'
    expect "allreduce_hello" "$out" '^\[1\]:rank 1 of 2 on gloo: allreduce=3$'
    echo "examples/external_project built on /usr/lib/cmake/LaunchSDK; under launch: allreduce=3 on 2 ranks"
  }
  purge() {
    local f left=()
    apt-get purge -y -q launch launch-sdk-dev
    for f in /usr/bin/launch /usr/share/man/man1/launch.1.gz /usr/share/bash-completion/completions/launch \
      /usr/lib/python3/dist-packages/launch_progress.py /usr/share/launch /usr/share/doc/launch \
      /usr/include/launch_sdk /usr/lib/cmake/LaunchSDK /usr/lib/liblaunch_worker_sdk.a \
      /usr/lib/python3/dist-packages/__pycache__/launch_progress.*; do
      [ ! -e "$f" ] || left+=("$f")
    done
    [ ${#left[@]} -eq 0 ] || { echo "left after apt-get purge: ${left[*]}"; return 1; }
    echo "apt-get purge launch launch-sdk-dev: nothing of them left"
  }

  check install install_packages
  if ! dpkg-query -W -f '${Status}' launch 2>/dev/null | grep -q 'install ok installed'; then
    echo "$me: the packages did not install: no further checks" >&2
    exit 1
  fi
  check version version
  check run run_true
  check man man_page
  check completion completion
  check python python_module
  check python-run python_worker
  check doc docs
  check sdk sdk_project
  check purge purge
  exit $((failures > 0))
fi

# ---- In the namespaces (second stage): the throwaway root. -----------------------------------
# PID 1 of a new PID namespace in a private mount namespace: when it exits the kernel kills
# whatever the checks left running, and its mounts go with the namespace.
if [ "${1:-}" = "--stage=ns" ]; then
  tmp=$2 base=$3 debs=$4 repo=$5 apt_cache=$6
  root=$tmp/root
  mkdir -p "$tmp/upper" "$tmp/work" "$root"
  if ! mount -t overlay overlay -o "lowerdir=$base,upperdir=$tmp/upper,workdir=$tmp/work" "$root" 2>"$tmp/overlay.err"; then
    echo "$me: no overlayfs here ($(cat "$tmp/overlay.err")): copying the base root instead" >&2
    cp -a "$base/." "$root/"
  fi
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=1777,size=1g tmpfs "$root/dev/shm"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mkdir -p "$root/src" "$root/debs"
  mount --bind "$repo" "$root/src"
  mount -o remount,bind,ro "$root/src"
  mount --bind "$debs" "$root/debs"
  mount -o remount,bind,ro "$root/debs"
  mkdir -p "$apt_cache/archives/partial" "$apt_cache/lists/partial"
  mount --bind "$apt_cache/archives" "$root/var/cache/apt/archives"
  mount --bind "$apt_cache/lists" "$root/var/lib/apt/lists"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  cp "$repo/scripts/test_package.sh" "$root/tmp/test_package.sh"
  chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive bash /tmp/test_package.sh --stage=root
  exit $?
fi

# ---- On the host (first stage). ---------------------------------------------------------------
[ $# -eq 1 ] || { echo "usage: $me BUILD_DIR" >&2; exit 2; }
if [ "$(id -u)" -ne 0 ]; then
  echo "$me: must run as root (apt-get, mmdebstrap, mount, chroot), got uid $(id -u)" >&2
  exit 2
fi
start=$SECONDS
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
[ -f "$build/CPackConfig.cmake" ] || { echo "$me: $build has no CPackConfig.cmake: configure it first (cmake -S . -B $1)" >&2; exit 2; }
for f in bin/launch share/man/man1/launch.1.gz share/bash-completion/completions/launch; do
  [ -f "$build/$f" ] || { echo "$me: $build/$f is missing: build first (cmake --build $1; the man page needs help2man)" >&2; exit 2; }
done
cache=${LAUNCH_ROOT_CACHE:-/var/cache/launch}

# The host's tools: cpack (cmake), dpkg-shlibdeps (dpkg-dev), mmdebstrap; unshare and setpriv
# (util-linux) are essential.
missing=()
command -v dpkg-shlibdeps >/dev/null || missing+=(dpkg-dev)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# One run at a time (the packages directory and the downloaded .debs are shared); a run killed
# outright leaves its files (never a mount or a process) in $cache/run.*, removed here.
mkdir -p "$cache"
exec 8>"$cache/.package-test.lock"
flock 8
rm -rf --one-file-system "$cache"/run.*
tmp=$(mktemp -d "$cache/run.XXXXXX")
debs=$build/packages
# Each long step (cpack, mmdebstrap, the root) runs as a child this shell waits for, so that a
# signal reaches the traps at once; cleanup stops it (mmdebstrap undoes its own mounts on TERM).
#   run_child [--stop=SIGNAL] COMMAND...: SIGNAL (TERM) is what cleanup sends it.
child=
child_stop=TERM
run_child() {
  child_stop=TERM
  case $1 in --stop=*) child_stop=${1#--stop=}; shift ;; esac
  # Background children would ignore SIGINT and SIGQUIT: env gives them back their default.
  env --default-signal=INT,QUIT "$@" &
  child=$!
  local rc=0
  wait "$child" || rc=$?
  child=
  return "$rc"
}
# running PID: whether that child has not exited yet (an exited child stays a zombie until waited for).
running() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -"$child_stop" "$child" 2>/dev/null || true
    # A child that does not stop in 30 s is killed.
    local i
    for ((i = 0; i < 300; i++)); do
      running "$child" || break
      sleep 0.1
    done
    kill -KILL "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  rm -rf "$debs/_CPack_Packages"
  # Nothing is mounted here on the host: the root's mounts lived in the namespace only.
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The packages.
rm -rf "$debs"
mkdir -p "$debs"
step=$SECONDS
if ! run_child nice -n 10 cpack -G DEB --config "$build/CPackConfig.cmake" -B "$debs" >"$tmp/cpack.log" 2>&1; then
  tail -n 30 "$tmp/cpack.log" >&2
  echo "FAIL cpack       in $build (log above)"
  exit 1
fi
rm -rf "$debs/_CPack_Packages"
shopt -s nullglob
packages=("$debs"/*.deb)
debug_packages=("$debs"/*.ddeb)
shopt -u nullglob
names=" "
for deb in "${packages[@]}"; do
  names+="$(dpkg-deb -f "$deb" Package) "
done
if [[ $names != *" launch "* || $names != *" launch-sdk-dev "* ]]; then
  echo "FAIL cpack       made${names}in $debs, not launch and launch-sdk-dev"
  exit 1
fi
echo "ok   cpack       ${#packages[@]} packages and ${#debug_packages[@]} debug symbol package in $debs ($((SECONDS - step))s)"
for deb in "${packages[@]}" "${debug_packages[@]}"; do
  printf '       %s: %s KiB, installed %s KiB; Depends: %s\n' "$(basename "$deb")" \
    $(($(stat -c %s "$deb") / 1024)) "$(dpkg-deb -f "$deb" Installed-Size)" "$(dpkg-deb -f "$deb" Depends)"
done

# The base root: Debian 12 (apt variant) with what the checks use besides the packages (a
# compiler, CMake and Ninja for the user project, man-db, bash-completion), made once.
base_packages=(cmake ninja-build g++ man-db bash-completion)
mmdebstrap_args=(--variant=apt --include="$(IFS=,; echo "${base_packages[*]}")" bookworm)
key=$(printf '%s\n' "${mmdebstrap_args[@]}" | sha256sum | cut -c1-12)
base=$cache/bookworm-$key
exec 9>"$cache/.lock"
flock 9
if [ ! -f "$base/.launch-root-complete" ]; then
  step=$SECONDS
  find "$cache" -maxdepth 1 -name 'bookworm-*' ! -name "bookworm-$key" ! -name bookworm-apt -exec rm -rf {} +
  rm -rf "$base.tmp"
  echo "$me: making the Debian 12 root $base (once)" >&2
  if ! run_child mmdebstrap "${mmdebstrap_args[@]}" "$base.tmp" >"$tmp/mmdebstrap.log" 2>&1; then
    tail -n 30 "$tmp/mmdebstrap.log" >&2
    rm -rf "$base.tmp"
    echo "FAIL root        mmdebstrap ${mmdebstrap_args[*]} (log above)"
    exit 1
  fi
  touch "$base.tmp/.launch-root-complete"
  mv "$base.tmp" "$base"
  echo "ok   root        made $base ($((SECONDS - step))s)"
else
  echo "ok   root        $base (cached)"
fi
flock -u 9

# setpriv: if this script dies, even by SIGKILL, unshare is killed, and --kill-child then kills
# the namespace's PID 1, which takes every process in it along. unshare ignores SIGTERM while
# its child runs: cleanup kills it.
rc=0
run_child --stop=KILL setpriv --pdeathsig KILL -- unshare --mount --propagation private --pid --kill-child=SIGKILL -- \
  bash "$repo/scripts/test_package.sh" --stage=ns "$tmp" "$base" "$debs" "$repo" "$cache/bookworm-apt" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "$me: FAILED (in $((SECONDS - start))s)"
  exit 1
fi
echo "$me: all checks passed in $((SECONDS - start))s"
