#!/usr/bin/env bash
# Compiles and links worker_sdk, train_mlp and the SDK's test programs against Debian 13's CUDA
# LibTorch 2.6 (libtorch-cuda-dev, CUDA 12.4) with NCCL 2.22 and USE_C10D_NCCL, inside the
# Debian 13 root, with -Werror on our code. With no driver here nothing of it can run: this proves
# the CUDA half compiles and links. The .debs are unpacked (dpkg -x) into a prefix cached next to
# the root: libtorch-cuda-2.6 depends on nvidia-cudnn, an installer that downloads from outside
# the archive, so the packages cannot be installed as such. The CUDA toolkit (CUDA_HOME, for
# CMake's FindCUDAToolkit and the CUDA headers) is this machine's, bind-mounted.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_home=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
if [ ! -x "$cuda_home/bin/nvcc" ]; then
  echo "build_cuda.sh: no CUDA toolkit at $cuda_home (set CUDA_HOME): CMake's FindCUDAToolkit and the CUDA headers need one" >&2
  exit 2
fi
root=$(bash scripts/debian13_root.sh)
cache=$(dirname "$root")
prefix=$cache/torch-cuda-2.6
packages=(libtorch-cuda-dev libtorch-cuda-2.6 libnccl2 libnccl-dev)
if [ ! -f "$prefix/.complete" ]; then
  echo "build_cuda.sh: fetching ${packages[*]} (about 710 MB) into $prefix"
  rm -rf "$prefix.tmp" "$cache/cuda-debs"
  mkdir -p "$prefix.tmp" "$cache/cuda-debs"
  bash scripts/in_root.sh "$root" --bind "$cache/cuda-debs:/debs" -- \
    bash -c "apt-get update -q >/dev/null && cd /debs && apt-get -o APT::Sandbox::User=root download -q ${packages[*]}"
  for deb in "$cache"/cuda-debs/*.deb; do dpkg -x "$deb" "$prefix.tmp"; done
  rm -rf "$cache/cuda-debs"
  touch "$prefix.tmp/.complete"
  rm -rf "$prefix"
  mv "$prefix.tmp" "$prefix"
fi
version=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$prefix/usr/include/torch/csrc/api/include/torch/version.h" | paste -sd. || true)
nccl=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$prefix/usr/include/nccl.h" | paste -sd. || true)
echo "build_cuda.sh: LibTorch ${version:-?} (CUDA), NCCL ${nccl:-?}, CUDA toolkit $cuda_home, build-cuda/"
fail() {
  echo "build_cuda.sh: FAILED against CUDA LibTorch ${version:-?} with NCCL ${nccl:-?}: $1" >&2
  exit 1
}
mkdir -p build-cuda
in_root=(bash scripts/in_root.sh "$root" --bind "$prefix:/opt/torch-cuda" --bind "$cuda_home:/usr/local/cuda" --)
"${in_root[@]}" cmake -S /src -B /src/build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH=/opt/torch-cuda/usr -DCUDAToolkit_ROOT=/usr/local/cuda -DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PROJECT_INCLUDE=/src/scripts/cuda_link_check.cmake -DLAUNCH_WERROR=ON \
  -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
  >build-cuda/configure.log 2>&1 || { tail -40 build-cuda/configure.log >&2; fail "cmake configure (build-cuda/configure.log)"; }
grep -E "worker_sdk: |Found CUDA|CUDA version|NCCL" build-cuda/configure.log || true
grep -q "worker_sdk: CUDA LibTorch" build-cuda/configure.log || fail "this LibTorch was not seen as a CUDA build"
"${in_root[@]}" cmake --build /src/build-cuda -j "$(nproc)" --target worker_sdk train_mlp sdk_worker sdk_unit_tests \
  || fail "build"
# The proof that NCCL was compiled in: ProcessGroupNCCL is referenced by our library.
nm -C build-cuda/worker_sdk/liblaunch_worker_sdk.a >build-cuda/worker_sdk.nm 2>&1 || fail "nm of worker_sdk"
grep -q "U c10d::ProcessGroupNCCL::ProcessGroupNCCL" build-cuda/worker_sdk.nm ||
  fail "worker_sdk does not reference c10d::ProcessGroupNCCL"
echo "build_cuda.sh: worker_sdk, train_mlp, sdk_worker and sdk_unit_tests compiled and linked against CUDA LibTorch $version with NCCL $nccl (USE_C10D_NCCL)"
