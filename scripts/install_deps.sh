#!/usr/bin/env bash
# Installs every build and test dependency of launch from Debian's archive. Idempotent.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" -ne 0 ]; then
  echo "install_deps.sh: must run as root (apt-get), got uid $(id -u)" >&2
  exit 2
fi
apt-get update -q
apt-get install -y -q --no-install-recommends \
  cmake ninja-build g++ pkg-config \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libyaml-cpp-dev libspdlog-dev libcli11-dev libabsl-dev libcpp-httplib-dev \
  libgtest-dev libgmock-dev \
  libtorch-dev libgloo-dev libopenblas0-pthread python3-torch \
  libssl-dev iproute2 procps openssl python3-yaml \
  clang-14 clang-format-14 libclang-rt-14-dev gdb \
  help2man dpkg-dev mmdebstrap \
  slurmctld slurmd slurm-client munge \
  etcd-server etcd-client golang-etcd-server-dev
