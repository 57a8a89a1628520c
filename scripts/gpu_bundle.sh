#!/usr/bin/env bash
# Makes build-gpu-bundle/, what scripts/gpu_check.sh needs on a GPU machine that has no -dev
# packages and no network: the launch binary built here (build/bin/launch, stripped), the two
# shared libraries it needs beyond glibc and libstdc++ (spdlog and fmt) beside it, found through
# its RUNPATH ($ORIGIN/../lib), and CLI11's headers for train_mlp. Run it on the Debian 12
# machine after the build; copy build-gpu-bundle/ with the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
if [ ! -x build/bin/launch ]; then
  echo "gpu_bundle.sh: build/bin/launch is missing: build first (cmake -S . -B build -G Ninja && cmake --build build)" >&2
  exit 2
fi
if ! command -v patchelf >/dev/null; then
  apt-get update -q && apt-get install -y -q --no-install-recommends patchelf
fi
out=build-gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/include"
cp build/bin/launch "$out/bin/launch"
strip "$out/bin/launch"
if ldd build/bin/launch | grep -q "not found"; then
  echo "gpu_bundle.sh: build/bin/launch has unresolved libraries: $(ldd build/bin/launch | grep 'not found' | tr -s ' \n' ' ')" >&2
  exit 1
fi
# Everything but glibc and libstdc++/libgcc must be in the bundle.
others=$(ldd build/bin/launch | awk '$1 !~ /^(linux-vdso|libc\.|libm\.|libstdc\+\+|libgcc_s|\/lib64\/ld-linux|libspdlog|libfmt)/ {print $1}')
if [ -n "$others" ]; then
  echo "gpu_bundle.sh: launch needs libraries the bundle does not carry: $others (build with LAUNCH_STATIC_DEPS=ON)" >&2
  exit 1
fi
libs=$(ldd build/bin/launch | awk '/libspdlog|libfmt/ {print $3}')
[ "$(echo "$libs" | wc -w)" -eq 2 ] || { echo "gpu_bundle.sh: expected launch to need libspdlog and libfmt, ldd says: $libs" >&2; exit 1; }
for lib in $libs; do cp -L "$lib" "$out/lib/"; done
patchelf --set-rpath '$ORIGIN/../lib' "$out/bin/launch"
cp -r /usr/include/CLI "$out/include/"
# rendezvous_bench (gRPC linked in, glibc and libstdc++ beside): the coordinator's scale measured
# with cores of its own, which this 2-core machine cannot give it.
if [ -x build/bin/rendezvous_bench ]; then
  cp build/bin/rendezvous_bench "$out/bin/" && strip "$out/bin/rendezvous_bench"
  extra=$(ldd build/bin/rendezvous_bench | awk '$1 !~ /^(linux-vdso|libc\.|libm\.|libstdc\+\+|libgcc_s|\/lib64\/ld-linux)/ {print $1}')
  if [ -n "$extra" ]; then
    echo "gpu_bundle.sh: rendezvous_bench needs libraries the bundle does not carry: $extra" >&2
    exit 1
  fi
fi
# The bundle must not lean on this machine's copies of the two libraries.
loaded=$(env LD_LIBRARY_PATH= ldd "$out/bin/launch" | awk '/libspdlog|libfmt/ {print $3}' | xargs -r readlink -f)
if [ "$(echo "$loaded" | grep -c "^$(readlink -f "$out/lib")/")" -ne 2 ]; then
  echo "gpu_bundle.sh: $out/bin/launch does not load spdlog/fmt from $out/lib" >&2
  exit 1
fi
# What the bundle was made from, for gpu_check.sh's report.
echo "$(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')" >"$out/SOURCE"
need() { objdump -T "$out/bin/launch" "$out"/lib/*.so* | grep -o "$1_[0-9.]*" | sort -uV | tail -1; }
echo "gpu_bundle.sh: $out/ ($(du -sh "$out" | cut -f1)) from $(cat "$out/SOURCE"): launch needs $(need GLIBC) and $(need GLIBCXX) or newer"
