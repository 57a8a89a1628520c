#!/usr/bin/env bash
# The GPU check: what the CPU-only CI cannot show, on a machine with an NVIDIA GPU.
#   bash scripts/gpu_check.sh REPORT_DIR
# The machine needs the NVIDIA driver, a CUDA toolkit (nvcc on PATH or in CUDA_HOME), CMake,
# Ninja and a python3 whose torch has CUDA, first on PATH; no gRPC or other -dev packages and no
# network. The checkout must carry build-gpu-bundle/, made by scripts/gpu_bundle.sh on a Debian 12
# machine (launch with its two shared libraries, CLI11's headers); GPU_CHECK_LAUNCH names another
# launch binary. worker_sdk and train_mlp are built here against torch's own CMake prefix, in a
# temporary directory. Every check prints a PASS or FAIL line; REPORT_DIR gets report.md (those
# lines and the figures) and logs.tar.gz, nothing else. About 4-6 minutes on one H200; checks
# not started by GPU_CHECK_DEADLINE seconds (default 480) are reported as FAIL, not run.
# Exit: 0 every check passed; 1 a check failed; 2 this machine cannot run the check (no GPU, no
# bundle, no CUDA torch), with one line saying why.
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: gpu_check.sh REPORT_DIR" >&2
  exit 2
fi
mkdir -p "$1" || { echo "gpu_check.sh: cannot create the report directory $1" >&2; exit 2; }
report_dir=$(CDPATH='' cd -- "$1" && pwd -P)
cd "$(dirname "$0")/.." || exit 2
repo=$(pwd -P)
report=$report_dir/report.md
bundle=$repo/build-gpu-bundle
launch=${GPU_CHECK_LAUNCH:-$bundle/bin/launch}
deadline=$((SECONDS + ${GPU_CHECK_DEADLINE:-480}))
python=$(command -v python3 || true)
work=$(mktemp -d /tmp/gpu_check.XXXXXX)
logs=$work/logs
build=$work/build
mkdir -p "$logs"
: >"$report"

say() { echo "$*" | tee -a "$report"; }
finish() {  # packs the logs next to the report, removes the rest
  tar -C "$work" -czf "$report_dir/logs.tar.gz" logs 2>/dev/null
  rm -rf "$work"
}
cannot() {
  say "gpu_check.sh: cannot run here: $*"
  finish
  exit 2
}
failures=0
check() {  # check NAME PASS|FAIL [DETAIL]
  say "$2 $1${3:+: $3}"
  [ "$2" = PASS ] || failures=$((failures + 1))
}
# A check starts only before the deadline; otherwise it is one FAIL line.
due() {
  [ $SECONDS -lt $deadline ] && return 0
  check "$1" FAIL "not run: the GPU_CHECK_DEADLINE passed"
  return 1
}
trap 'say "gpu_check.sh: stopped by a signal after $failures failure(s)"; finish; exit 1' TERM INT

# ---- what this machine has --------------------------------------------------------------------
[ -x "$launch" ] || cannot "$launch is missing: run scripts/gpu_bundle.sh on a Debian 12 machine after the build and carry build-gpu-bundle/"
# launch's own NVML probe. Without an inherited CUDA_VISIBLE_DEVICES or PYTORCH_CUDA_ALLOC_CONF,
# launch sets both itself.
env -u CUDA_VISIBLE_DEVICES -u PYTORCH_CUDA_ALLOC_CONF "$launch" --nproc-per-node=gpu --dry-run /bin/true \
  >"$logs/dry_run.log" 2>&1
dry=$?
# Whether torch sees a GPU decides "no GPU here"; a failing NVML probe with a GPU is check 1's FAIL.
torch_info=
if [ -n "$python" ]; then
  torch_info=$("$python" - 2>"$logs/torch.err" <<'EOF'
import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no GPU"
print(f"version={torch.__version__}")
print(f"cuda={torch.version.cuda}")
print(f"gpu={torch.cuda.get_device_name(0)}")
print(f"prefix={torch.utils.cmake_prefix_path}")
EOF
  ) || torch_info=
fi
field() { printf '%s\n' "$torch_info" | sed -n "s/^$1=//p"; }
if [ -z "$torch_info" ]; then
  if [ $dry -ne 0 ] && grep -q "no GPU" "$logs/dry_run.log"; then
    cannot "no GPU: $(grep -m1 'no GPU' "$logs/dry_run.log")"
  fi
  cannot "python3 (${python:-none on PATH}) has no torch that sees a GPU: $(tail -1 "$logs/torch.err" 2>/dev/null)"
fi
torch_version=$(field version)
cmake_prefix=$(field prefix)
command -v cmake >/dev/null || cannot "no cmake on PATH"
command -v ninja >/dev/null || cannot "no ninja on PATH"
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
[ -x "$nvcc" ] || cannot "no nvcc (PATH or CUDA_HOME/bin)"
cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
# sm_90 for Hopper; anything else this GPU is, from torch.
arch=$("$python" -c 'import torch; print("%d%d" % torch.cuda.get_device_capability(0))' 2>/dev/null || echo 90)
# nccl.h for ProcessGroupNCCL.hpp: PyTorch's wheels keep it in the nvidia-nccl package.
nccl_include=$("$python" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "include"))' 2>/dev/null || true)
say "# GPU check: $(field gpu), torch $torch_version (CUDA $(field cuda)), nvcc $cuda_root, $(date -u +%F)"
if [ -f "$bundle/SOURCE" ]; then
  here=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
  say "launch from $(cat "$bundle/SOURCE"); this checkout: $here"
  grep -q "^$here" "$bundle/SOURCE" || say "WARNING: build-gpu-bundle/ was made from another commit than this checkout"
fi
say ""

# ---- 1. NVML and the environment launch sets ----------------------------------------------------
env_line() { grep -m1 -o "$1=[^ ]*" "$logs/dry_run.log"; }
cvd=$(env_line CUDA_VISIBLE_DEVICES)
alloc=$(env_line PYTORCH_CUDA_ALLOC_CONF)
if [ $dry -eq 0 ] && [ -n "$cvd" ] && [ "$alloc" = "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128" ]; then
  check "NVML sees the GPU; --nproc-per-node=gpu --dry-run sets $cvd and $alloc" PASS
else
  check "NVML sees the GPU; --dry-run sets CUDA_VISIBLE_DEVICES and PYTORCH_CUDA_ALLOC_CONF" FAIL \
    "exit $dry: $(tail -1 "$logs/dry_run.log")"
fi

# ---- 2. worker_sdk and train_mlp against torch's own CMake prefix -------------------------------
start=$SECONDS
if cmake -S "$repo/scripts/gpu_check" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
     -DCMAKE_PREFIX_PATH="$cmake_prefix" -DCLI11_INCLUDE_DIR="$bundle/include" \
     -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_root" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
     ${nccl_include:+-DNCCL_INCLUDE_DIR="$nccl_include"} >"$logs/configure.log" 2>&1 &&
   grep -q "worker_sdk: CUDA LibTorch" "$logs/configure.log" &&
   cmake --build "$build" -j "$(nproc)" >"$logs/build.log" 2>&1; then
  check "worker_sdk and train_mlp built against torch $torch_version with NCCL ($((SECONDS - start)) s)" PASS
else
  check "worker_sdk and train_mlp built against torch $torch_version with NCCL" FAIL \
    "see configure.log, build.log in logs.tar.gz: $(grep -m1 -E 'error|Error' "$logs/configure.log" "$logs/build.log" 2>/dev/null)"
  say ""
  say "gpu_check.sh: $failures check(s) failed; the others need train_mlp"
  finish
  exit 1
fi
train=$build/bin/train_mlp
# Deterministic cuBLAS, so that a resumed run can be compared with an undisturbed one.
export CUBLAS_WORKSPACE_CONFIG=:4096:8
unset RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT

run() {  # run LOG ARGS...: launch ARGS (at most 120 s), output to logs/LOG; launch's exit code
  local log=$logs/$1
  shift
  timeout -k 10 120 "$launch" "$@" >"$log" 2>&1
}
done_line() { grep -m1 -o 'done: steps=.*' "$logs/$1"; }
# A finished fp16/bf16 run: a finite loss, and (fp16) fewer than half of the steps skipped.
trained() {
  local line
  line=$(done_line "$1") || return 1
  "$python" -c '
import math, re, sys
line, steps = sys.argv[1], int(sys.argv[2])
loss = float(re.search(r"loss=(\S+)", line).group(1))
skipped = re.search(r"skipped_steps=(\d+)", line)
sys.exit(0 if math.isfinite(loss) and (not skipped or int(skipped.group(1)) < steps // 2) else 1)' "$line" "$2"
}

# ---- 3. train_mlp on CUDA with NCCL, fp32, fp16 + GradScaler, bf16 --------------------------------
flags=(--steps 300 --warmup 50 --print-every 100)
train_check() {  # train_check NAME LOG EXPECTED_LINE [TRAIN_MLP ARGS...]
  local name=$1 log=$2 expect=$3
  shift 3
  due "$name" || return 0
  if run "$log" --nproc-per-node=1 "$train" "${flags[@]}" "$@" && grep -q "$expect" "$logs/$log" &&
     trained "$log" 300; then
    check "$name" PASS "$(done_line "$log")"
  else
    check "$name" FAIL "see $log"
  fi
}
train_check "train_mlp trains on cuda:0 with NCCL under launch (world 1)" train_fp32.log "nccl on cuda:0"
train_check "train_mlp --amp=fp16 with GradScaler" train_fp16.log "amp fp16 with GradScaler" --amp=fp16
train_check "train_mlp --amp=bf16" train_bf16.log "amp bf16" --amp=bf16

# ---- 4. checkpoint and resume after a fault-injected kill ----------------------------------------
ck=(--steps 60 --warmup 0 --print-every 0 --checkpoint-every 10 --amp=fp16)
name="checkpoint and resume on CUDA (fp16): killed at step 33, resumed from 30, parameters equal an undisturbed run"
if due "$name"; then
  if run resume_straight.log --nproc-per-node=1 "$train" "${ck[@]}" --checkpoint-dir "$work/ckpt_a" \
       --save-params "$work/params_a.bin" &&
     run resume_killed.log --nproc-per-node=1 --max-restarts=1 "$train" "${ck[@]}" --checkpoint-dir "$work/ckpt_b" \
       --save-params "$work/params_b.bin" --fail-at-step 33 --fail-rank 0 &&
     grep -q "resumed from step 30" "$logs/resume_killed.log"; then
    # nan when the sizes differ or any value is not finite (max() would skip a NaN).
    diff=$("$python" -c '
import array, math, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:])
ok = len(a) == len(b) and len(a) > 0 and all(map(math.isfinite, a)) and all(map(math.isfinite, b))
print(max(abs(x - y) for x, y in zip(a, b)) if ok else "nan")' "$work/params_a.bin" "$work/params_b.bin" 2>&1)
    if "$python" -c 'import sys; d = float(sys.argv[1]); sys.exit(0 if d <= 1e-5 else 1)' "$diff" 2>/dev/null; then
      check "$name" PASS "max |diff| $diff"
    else
      check "$name" FAIL "max |diff| $diff (see resume_*.log)"
    fi
  else
    check "$name" FAIL "see resume_straight.log, resume_killed.log"
  fi
fi

# ---- 5. an unmodified Python DDP script on NCCL under launch -------------------------------------
name="Python DDP (NCCL, cuda) under launch"
if due "$name"; then
  if PYTHON_EXEC="$python" run python_ddp.log --nproc-per-node=1 "$repo/examples/python/train_ddp.py" --device cuda \
       "${flags[@]}" && trained python_ddp.log 300; then
    check "$name" PASS "$(done_line python_ddp.log)"
  else
    check "$name" FAIL "see python_ddp.log"
  fi
fi

# ---- 6. the profiler's trace has CUDA kernels -----------------------------------------------------
name="LAUNCH_PROFILE_STEPS trace has CUDA kernels"
if due "$name"; then
  if LAUNCH_PROFILE_STEPS=5-6 run profile.log --nproc-per-node=1 --log-dir "$work/prof" --rdzv-id prof \
       "$train" --steps 8 --warmup 0 --print-every 0; then
    trace=$work/prof/prof/attempt_0/0/trace_rank0.json
    kernels=$(grep -o '"cat": *"kernel"' "$trace" 2>/dev/null | wc -l)
    gzip -c "$trace" >"$logs/trace_rank0.json.gz" 2>/dev/null
    if [ "$kernels" -gt 0 ]; then
      check "$name" PASS "$kernels kernel events in trace_rank0.json"
    else
      check "$name" FAIL "no \"cat\": \"kernel\" event in trace_rank0.json (see profile.log)"
    fi
  else
    check "$name" FAIL "see profile.log"
  fi
fi

# ---- 7. steps/s: the C++ worker vs the same model in Python DDP, on the GPU -----------------------
name="steps/s, train_mlp vs Python DDP on the GPU (bench/bench_ddp.py --nproc 1 --device cuda --reps 3)"
if due "$name"; then
  if timeout -k 10 240 "$python" "$repo/bench/bench_ddp.py" --launch "$launch" --train-mlp "$train" --python "$python" \
       --nproc 1 --device cuda --reps 3 --timeout 60 --loss-rtol 1e-3 >"$logs/bench_ddp.log" 2>&1; then
    check "$name" PASS "measured (the targets in the table are the CPU ones)"
    sed -n '/^config/,$p' "$logs/bench_ddp.log" | tee -a "$report"
  else
    check "$name" FAIL "see bench_ddp.log: $(tail -1 "$logs/bench_ddp.log")"
  fi
fi

# ---- 8. the coordinator at 16,384 agents, on cores of its own -----------------------------------
# On the 2-core CI machine the simulated agents share the coordinator's two cores; here the
# coordinator gets two (taskset) and the simulator the rest, as on a cluster.
name="coordinator: 16,384 agents' round <= 2 s and leases <= 50% of a core, on 2 cores of its own"
if due "$name"; then
  cores=$(nproc)
  if [ ! -x "$bundle/bin/rendezvous_bench" ] || ! command -v taskset >/dev/null || [ "$cores" -lt 6 ]; then
    check "$name" FAIL "needs build-gpu-bundle/bin/rendezvous_bench, taskset and 6 cores (has $cores)"
  else
    printf '#!/bin/sh\nexec taskset -c 0,1 "%s" "$@"\n' "$launch" >"$work/pinned_launch"
    chmod +x "$work/pinned_launch"
    if timeout -k 10 240 taskset -c "2-$((cores - 1))" "$bundle/bin/rendezvous_bench" "$work/pinned_launch" \
         --agents 4096,16384 --window 5 >"$logs/rendezvous_bench.log" 2>&1 &&
       grep -q "16384 agents' round formed <= 2 s: met" "$logs/rendezvous_bench.log" &&
       grep -q "16384 agents at 1 Hz <= 50% of one core, all served: met" "$logs/rendezvous_bench.log"; then
      check "$name" PASS "measured"
    else
      check "$name" FAIL "see rendezvous_bench.log: $(grep -m1 MISSED "$logs/rendezvous_bench.log" || tail -1 "$logs/rendezvous_bench.log")"
    fi
    grep -E "^(agents|4096|16384) " "$logs/rendezvous_bench.log" | tee -a "$report"
  fi
fi

say ""
finish
if [ $failures -eq 0 ]; then
  say "gpu_check.sh: every check passed"
  exit 0
fi
say "gpu_check.sh: $failures check(s) failed"
exit 1
