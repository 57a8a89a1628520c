#!/usr/bin/env bash
# Prints the path of a Debian 13 (trixie) root holding the project's build and test dependencies
# against Debian 13's LibTorch 2.6 and Python torch 2.6, and makes it first when it is missing.
# The root is cached on this machine (not in the repo) under LAUNCH_ROOT_CACHE
# (default /var/cache/launch), keyed by mmdebstrap's arguments, so a changed list makes a new root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" -ne 0 ]; then
  echo "debian13_root.sh: must run as root (mmdebstrap, chroot), got uid $(id -u)" >&2
  exit 2
fi
cache=${LAUNCH_ROOT_CACHE:-/var/cache/launch}

# The same dependencies as scripts/install_deps.sh, from Debian 13 (whose static OpenSSL also
# needs libzstd-dev; whose etcd 3.5 .proto files import googleapis from gogo's package and
# grpc-gateway's openapiv2 options).
packages=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev libspdlog-dev libcli11-dev libabsl-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev
  libtorch-dev libgloo-dev libopenblas0-pthread python3-torch
  libssl-dev libzstd-dev iproute2 procps openssl gdb mount python3-yaml
  etcd-server etcd-client golang-etcd-server-dev golang-github-gogo-googleapis-dev
  golang-github-grpc-ecosystem-grpc-gateway-dev
)
# contrib: libtorch-cuda-dev and libnccl-dev, which scripts/build_cuda.sh unpacks.
mmdebstrap_args=(--variant=apt --components=main,contrib --include="$(IFS=,; echo "${packages[*]}")" trixie)
key=$(printf '%s\n' "${mmdebstrap_args[@]}" | sha256sum | cut -c1-12)
root=$cache/trixie-$key
if [ -f "$root/.launch-root-complete" ]; then
  echo "$root"
  exit 0
fi
mkdir -p "$cache"
# One maker at a time; a second waits and then finds the root made.
exec 9>"$cache/.lock"
flock 9
if [ -f "$root/.launch-root-complete" ]; then
  echo "$root"
  exit 0
fi

if ! command -v mmdebstrap >/dev/null; then
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends mmdebstrap >&2
fi
# Roots made from an older package list are not used again.
find "$cache" -maxdepth 1 -name 'trixie-*' ! -name "trixie-$key" -exec rm -rf {} + >&2
rm -rf "$root.tmp"
echo "debian13_root.sh: making the Debian 13 root $root (about 2 minutes, 1.8 GB)" >&2
mmdebstrap "${mmdebstrap_args[@]}" "$root.tmp" >&2
touch "$root.tmp/.launch-root-complete"
mv "$root.tmp" "$root"
echo "$root"
