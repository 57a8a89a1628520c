#!/usr/bin/env bash
# The GPU check: what the CPU-only CI cannot show, on a machine with an NVIDIA GPU.
#   bash scripts/gpu_check.sh REPORT_DIR
# The machine needs the NVIDIA driver, a CUDA toolkit (nvcc), CMake, Ninja and a python3 whose
# torch has CUDA, first on PATH; no gRPC or other -dev packages and no network. The checkout must
# carry build-gpu-bundle/, made by scripts/gpu_bundle.sh on a Debian 12 machine (launch with its
# two shared libraries, CLI11's headers). worker_sdk and train_mlp are built here against torch's
# own CMake prefix. Every check prints (and writes to REPORT_DIR/report.md) a PASS or FAIL line;
# the logs go to REPORT_DIR too. Takes 3-5 minutes on one H200.
# Exit: 0 every check passed; 1 a check failed; 2 this machine cannot run the check (no GPU, no
# bundle, no CUDA torch), with one line saying why.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
if [ $# -ne 1 ]; then
  echo "usage: gpu_check.sh REPORT_DIR" >&2
  exit 2
fi
mkdir -p "$1" || { echo "gpu_check.sh: cannot create the report directory $1" >&2; exit 2; }
report_dir=$(cd "$1" && pwd)
report=$report_dir/report.md
bundle=$repo/build-gpu-bundle
launch=$bundle/bin/launch
build=$repo/build-gpu
python=$(command -v python3 || true)
: >"$report"

say() { echo "$*" | tee -a "$report"; }
cannot() {
  say "gpu_check.sh: cannot run here: $*"
  exit 2
}
failures=0
check() {  # check NAME PASS|FAIL DETAIL
  say "$2 $1${3:+: $3}"
  [ "$2" = PASS ] || failures=$((failures + 1))
}

# ---- what this machine has --------------------------------------------------------------------
[ -x "$launch" ] || cannot "$launch is missing: run scripts/gpu_bundle.sh on a Debian 12 machine after the build and carry build-gpu-bundle/"
# launch's own NVML probe: the clearest "no GPU" there is, and the first check.
# Without an inherited CUDA_VISIBLE_DEVICES or PYTORCH_CUDA_ALLOC_CONF, launch sets both itself.
env -u CUDA_VISIBLE_DEVICES -u PYTORCH_CUDA_ALLOC_CONF "$launch" --nproc-per-node=gpu --dry-run /bin/true \
  >"$report_dir/dry_run.log" 2>&1
dry=$?
if [ $dry -ne 0 ]; then
  if grep -q "no GPU" "$report_dir/dry_run.log"; then
    cannot "no GPU: $(grep -m1 'no GPU' "$report_dir/dry_run.log")"
  fi
  cannot "launch --nproc-per-node=gpu --dry-run failed: $(tail -1 "$report_dir/dry_run.log")"
fi
[ -n "$python" ] || cannot "no python3 on PATH"
"$python" - >"$report_dir/torch.txt" 2>&1 <<'EOF' || cannot "python3 has no CUDA torch: $(tail -1 "$report_dir/torch.txt")"
import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no GPU"
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), torch.utils.cmake_prefix_path, sep="\n")
EOF
torch_version=$(sed -n 1p "$report_dir/torch.txt")
gpu_name=$(sed -n 3p "$report_dir/torch.txt")
cmake_prefix=$(sed -n 4p "$report_dir/torch.txt")
command -v cmake >/dev/null || cannot "no cmake on PATH"
command -v ninja >/dev/null || cannot "no ninja on PATH"
command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || cannot "no nvcc (PATH or CUDA_HOME)"
# nccl.h for ProcessGroupNCCL.hpp: PyTorch's wheels keep it in the nvidia-nccl package.
nccl_include=$("$python" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "include"))' 2>/dev/null || true)
say "# GPU check: $gpu_name, torch $torch_version (CUDA $(sed -n 2p "$report_dir/torch.txt")), $(date -u +%F)"
say ""

# ---- 1. NVML and the environment launch sets ----------------------------------------------------
env_line() { grep -m1 -o "$1=[^ ]*" "$report_dir/dry_run.log" | head -1; }
cvd=$(env_line CUDA_VISIBLE_DEVICES)
alloc=$(env_line PYTORCH_CUDA_ALLOC_CONF)
if [ -n "$cvd" ] && [ "$alloc" = "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128" ]; then
  check "NVML sees the GPU; --nproc-per-node=gpu --dry-run sets $cvd and $alloc" PASS
else
  check "NVML sees the GPU; --dry-run sets CUDA_VISIBLE_DEVICES and PYTORCH_CUDA_ALLOC_CONF" FAIL "see dry_run.log"
fi

# ---- 2. worker_sdk and train_mlp against torch's own CMake prefix -------------------------------
start=$(date +%s)
if cmake -S "$repo/scripts/gpu_check" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_PREFIX_PATH="$cmake_prefix" -DCLI11_INCLUDE_DIR="$bundle/include" \
     ${nccl_include:+-DNCCL_INCLUDE_DIR="$nccl_include"} >"$report_dir/configure.log" 2>&1 &&
   grep -q "worker_sdk: CUDA LibTorch" "$report_dir/configure.log" &&
   cmake --build "$build" -j "$(nproc)" >"$report_dir/build.log" 2>&1; then
  check "worker_sdk and train_mlp built against torch $torch_version with NCCL ($(( $(date +%s) - start )) s)" PASS
else
  check "worker_sdk and train_mlp built against torch $torch_version with NCCL" FAIL "see configure.log, build.log"
  say ""
  say "gpu_check.sh: $failures check(s) failed; the rest need train_mlp"
  exit 1
fi
train=$build/bin/train_mlp
# Deterministic cuBLAS, so that a resumed run can be compared with an undisturbed one.
export CUBLAS_WORKSPACE_CONFIG=:4096:8
unset RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT

run() {  # run LOG ARGS...: launch ARGS, output to REPORT_DIR/LOG; returns launch's exit code
  local log=$report_dir/$1
  shift
  timeout 300 "$launch" "$@" >"$log" 2>&1
}
done_line() { grep -m1 -o 'done: steps=.*' "$report_dir/$1"; }

# ---- 3. train_mlp on CUDA with NCCL, fp32, fp16 + GradScaler, bf16 --------------------------------
flags=(--steps 300 --warmup 50 --print-every 100)
if run train_fp32.log --nproc-per-node=1 "$train" "${flags[@]}" && grep -q "nccl on cuda:0" "$report_dir/train_fp32.log"; then
  check "train_mlp trains on cuda:0 with NCCL under launch (world 1)" PASS "$(done_line train_fp32.log)"
else
  check "train_mlp trains on cuda:0 with NCCL under launch (world 1)" FAIL "see train_fp32.log"
fi
if run train_fp16.log --nproc-per-node=1 "$train" "${flags[@]}" --amp=fp16 &&
   grep -q "amp fp16 with GradScaler" "$report_dir/train_fp16.log" && [[ "$(done_line train_fp16.log)" == *loss=[0-9]* ]]; then
  check "train_mlp --amp=fp16 with GradScaler" PASS "$(done_line train_fp16.log)"
else
  check "train_mlp --amp=fp16 with GradScaler" FAIL "see train_fp16.log"
fi
if run train_bf16.log --nproc-per-node=1 "$train" "${flags[@]}" --amp=bf16 &&
   grep -q "amp bf16" "$report_dir/train_bf16.log" && [[ "$(done_line train_bf16.log)" == *loss=[0-9]* ]]; then
  check "train_mlp --amp=bf16" PASS "$(done_line train_bf16.log)"
else
  check "train_mlp --amp=bf16" FAIL "see train_bf16.log"
fi

# ---- 4. checkpoint and resume after a fault-injected kill ----------------------------------------
ck=(--steps 60 --warmup 0 --print-every 0 --checkpoint-every 10 --amp=fp16)
rm -rf "$report_dir/ckpt_a" "$report_dir/ckpt_b"
if run resume_straight.log --nproc-per-node=1 "$train" "${ck[@]}" --checkpoint-dir "$report_dir/ckpt_a" \
     --save-params "$report_dir/params_a.bin" &&
   run resume_killed.log --nproc-per-node=1 --max-restarts=1 "$train" "${ck[@]}" --checkpoint-dir "$report_dir/ckpt_b" \
     --save-params "$report_dir/params_b.bin" --fail-at-step 33 --fail-rank 0 &&
   grep -q "resumed from step 30" "$report_dir/resume_killed.log"; then
  diff=$("$python" -c '
import array, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:])
print(max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) and len(a) else "inf")' \
    "$report_dir/params_a.bin" "$report_dir/params_b.bin")
  if "$python" -c "import sys; sys.exit(0 if float('$diff') <= 1e-5 else 1)"; then
    check "checkpoint and resume on CUDA (fp16): killed at step 33, resumed from 30, parameters equal an undisturbed run" PASS "max |diff| $diff"
  else
    check "checkpoint and resume on CUDA (fp16)" FAIL "max |diff| $diff (see resume_*.log)"
  fi
else
  check "checkpoint and resume on CUDA (fp16) after a fault-injected kill" FAIL "see resume_straight.log, resume_killed.log"
fi

# ---- 5. an unmodified Python DDP script on NCCL under launch -------------------------------------
if PYTHON_EXEC="$python" run python_ddp.log --nproc-per-node=1 "$repo/examples/python/train_ddp.py" --device cuda \
     "${flags[@]}" && done_line python_ddp.log >/dev/null; then
  check "Python DDP (NCCL, cuda) under launch" PASS "$(done_line python_ddp.log)"
else
  check "Python DDP (NCCL, cuda) under launch" FAIL "see python_ddp.log"
fi

# ---- 6. the profiler's trace has CUDA kernels -----------------------------------------------------
rm -rf "$report_dir/prof"
if LAUNCH_PROFILE_STEPS=5-6 run profile.log --nproc-per-node=1 --log-dir "$report_dir/prof" --rdzv-id prof \
     "$train" --steps 8 --warmup 0 --print-every 0; then
  trace=$report_dir/prof/prof/attempt_0/0/trace_rank0.json
  kernels=$(grep -o '"cat": *"kernel"' "$trace" 2>/dev/null | wc -l)
  if [ "$kernels" -gt 0 ]; then
    check "LAUNCH_PROFILE_STEPS trace has CUDA kernels" PASS "$kernels kernel events in $(basename "$trace")"
  else
    check "LAUNCH_PROFILE_STEPS trace has CUDA kernels" FAIL "no \"cat\": \"kernel\" event in $trace (see profile.log)"
  fi
else
  check "LAUNCH_PROFILE_STEPS trace has CUDA kernels" FAIL "see profile.log"
fi

# ---- 7. steps/s: the C++ worker vs the same model in Python DDP, on the GPU -----------------------
if PYTHON_EXEC="$python" "$python" "$repo/bench/bench_ddp.py" --launch "$launch" --train-mlp "$train" \
     --python "$python" --nproc 1 --device cuda --reps 3 --loss-rtol 1e-3 >"$report_dir/bench_ddp.log" 2>&1; then
  check "steps/s, train_mlp vs Python DDP on the GPU (bench/bench_ddp.py --nproc 1 --device cuda --reps 3)" PASS
  sed -n '/^config/,$p' "$report_dir/bench_ddp.log" | tee -a "$report"
else
  check "steps/s, train_mlp vs Python DDP on the GPU" FAIL "see bench_ddp.log"
fi

say ""
if [ $failures -eq 0 ]; then
  say "gpu_check.sh: every check passed"
  exit 0
fi
say "gpu_check.sh: $failures check(s) failed"
exit 1
