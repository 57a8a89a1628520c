#!/usr/bin/python3
"""Side-by-side training throughput: worker_sdk's train_mlp (C++) vs PyTorch DDP (train_ddp.py).

Both run the same workload (same flags, same seed: the final loss must match) as 2 ranks on CPU
under `launch --nproc-per-node=2`. Python DDP all-reduces through Gloo; the C++ side through
worker_sdk's shared-memory all-reduce (the default for ranks on one host), or through Gloo too
with --shm-allreduce 0. Configs:
  a  dims 784,1024,1024,10, batch 64/rank  (compute-bound)   target C++/Python steps/s >= 1.0
  b  dims 64,128,128,10,    batch 32/rank  (overhead-bound)  target C++/Python steps/s >= 2.0

Runs are interleaved (C++ Python, then Python C++ in the next repetition, ...) so slow drifts
of the machine's load hit both sides alike. Reported: median, min and max steps/s per side (rank
0's `steps_per_s`, measured after the warm-up between two barriers), the ratio of the medians
(what the target is judged on) and the range of the per-repetition paired ratios.

Standard library only. Run with Debian's Python (it has torch 1.13):
    /usr/bin/python3 bench/bench_ddp.py [--reps N] [--configs a,b]

Exit status: 0 when every run succeeded and the losses agree (a missed target prints MISSED but
still exits 0); 1 on a harness error (bad arguments, a missing binary, a run that failed, hung,
printed no result line or left processes behind); 2 when everything ran but the C++ and
Python losses differ by more than --loss-rtol (the two sides did not compute the same thing).
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)

sys.path.insert(0, BENCH_DIR)
import harness  # noqa: E402  (bench/harness.py, next to this script)

# name: (dims, per-rank batch, steps, warm-up steps, target C++/Python ratio)
CONFIGS = {
    "a": ("784,1024,1024,10", 64, 120, 20, 1.0),
    "b": ("64,128,128,10", 32, 1200, 200, 2.0),
}

DONE_RE = re.compile(r"^\[0\]:done: steps=(\d+) loss=(\S+) measured_steps=(\d+) steps_per_s=(\S+)\s*$",
                     re.M)
THREADS_RE = re.compile(r"\] threads: (.*?)\s*$", re.M)

# Variables a parent launcher may have set; the runs under test must not inherit them.
_SCRUB_PREFIXES = ("TORCHELASTIC_", "LAUNCH_")
_SCRUB_NAMES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
}


# Processes: every run has a timeout; nothing it starts outlives it (harness.py, shared with
# bench_launch.py).
HarnessError = harness.HarnessError  # could not measure something (bad arguments, missing binary, failed run)
_tail = harness.tail


def run_once(argv, env, timeout, log_path, stop_grace=5.0):
    """Run argv (own session; stdout+stderr to log_path) to completion. Returns (exit code,
    wall seconds). On timeout: SIGTERM the launcher (it stops its workers), then SIGKILL it and
    every descendant, and raise HarnessError. Processes left behind are killed and reported
    (HarnessError)."""
    r = harness.run_once(argv, env, timeout, log_path, stop_grace=stop_grace, poll_s=0.01,
                         leftover_tries=100, on_timeout=harness.timeout_error,
                         on_leak=harness.leak_error)
    return r.code, r.wall_s


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------

class Sample:
    def __init__(self, steps_per_s, loss, wall_s, threads):
        self.steps_per_s = steps_per_s
        self.loss = loss
        self.wall_s = wall_s
        self.threads = threads


def train_argv(args, side, dims, batch, steps, warmup):
    flags = ["--dims", dims, "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
             "--print-every", "0"]
    if side == "C++":
        return [args.launch, f"--nproc-per-node={args.nproc}", args.train_mlp] + flags
    # train_mlp trains on CUDA whenever LibTorch sees a GPU; train_ddp.py is told.
    return [args.launch, f"--nproc-per-node={args.nproc}", args.train_ddp, "--device", args.device] + flags


def run_train(args, env, tmp, side, cfg, steps, warmup, tag):
    dims, batch = CONFIGS[cfg][0], CONFIGS[cfg][1]
    argv = train_argv(args, side, dims, batch, steps, warmup)
    log = os.path.join(tmp, f"{cfg}-{side.replace('+', 'p')}-{tag}.log")
    code, wall = run_once(argv, env, args.timeout, log)
    with open(log, "rb") as f:
        out = f.read().decode("utf-8", "replace")
    if code != 0:
        raise HarnessError(f"exit code {code}: {' '.join(argv)}\n  output tail:\n{_tail(log)}")
    m = DONE_RE.findall(out)
    if len(m) != 1:
        raise HarnessError(f"expected one '[0]:done: ...' line, found {len(m)}: {' '.join(argv)}\n"
                           f"  output tail:\n{_tail(log)}")
    r_steps, loss, measured, sps = m[0]
    try:
        r_steps, loss, measured, sps = int(r_steps), float(loss), int(measured), float(sps)
    except ValueError:
        raise HarnessError(f"unparsable result line {m[0]}: {' '.join(argv)}")
    if r_steps != steps or measured != steps - warmup or not sps > 0:
        raise HarnessError(f"unexpected result steps={r_steps} measured_steps={measured} "
                           f"steps_per_s={sps} (want steps={steps} measured_steps={steps - warmup}): "
                           f"{' '.join(argv)}")
    th = THREADS_RE.search(out)
    return Sample(sps, loss, wall, th.group(1) if th else "?"), argv


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def rel_diff(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def fmt_row(cells, widths):
    return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()


def print_table(head, rows):
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    print(fmt_row(head, widths))
    print(line)
    for r in rows:
        print(fmt_row(r, widths))
    print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="measured runs per side and config (default 5)")
    ap.add_argument("--configs", default="a,b", help="comma-separated subset of: " + ",".join(CONFIGS))
    ap.add_argument("--steps-scale", type=float, default=1.0,
                    help="multiply every config's steps and warm-up by this (default 1)")
    ap.add_argument("--no-warmup-run", action="store_true",
                    help="skip the short uncounted run per side that warms the page cache")
    ap.add_argument("--launch", default=os.path.join(REPO_ROOT, "build", "bin", "launch"))
    ap.add_argument("--train-mlp", default=os.path.join(REPO_ROOT, "build", "bin", "train_mlp"))
    ap.add_argument("--train-ddp", default=os.path.join(REPO_ROOT, "examples", "python", "train_ddp.py"))
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="PYTHON_EXEC for train_ddp.py: an interpreter with torch (default /usr/bin/python3)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per run before it counts as hung")
    ap.add_argument("--shm-allreduce", choices=("1", "0"), default="1",
                    help="LAUNCH_SHM_ALLREDUCE for the C++ side: 1 (default) all-reduces through shared "
                         "memory, 0 through Gloo like the Python side")
    ap.add_argument("--loss-rtol", type=float, default=1e-4, help="allowed relative C++/Python loss difference")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (--nproc-per-node, default 2)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: Python DDP on NCCL and the GPUs (train_mlp uses CUDA whenever it sees a GPU)")
    args = ap.parse_args()

    cfgs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if args.reps < 1 or not cfgs or any(c not in CONFIGS for c in cfgs) or args.steps_scale <= 0 or args.nproc < 1:
        raise HarnessError(f"bad arguments: --reps >= 1, --configs from {','.join(CONFIGS)}, --steps-scale > 0, "
                           "--nproc >= 1")
    for what, path in (("--launch", args.launch), ("--train-mlp", args.train_mlp), ("--python", args.python)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise HarnessError(f"{what} {path}: not an executable file (build: ninja -C build train_mlp launch)")
    if not os.path.isfile(args.train_ddp):
        raise HarnessError(f"--train-ddp {args.train_ddp}: missing")
    args.launch, args.train_mlp, args.train_ddp = map(os.path.abspath, (args.launch, args.train_mlp, args.train_ddp))

    env = {k: v for k, v in os.environ.items() if k not in _SCRUB_NAMES and not k.startswith(_SCRUB_PREFIXES)}
    env["PYTHON_EXEC"] = args.python
    env["LAUNCH_SHM_ALLREDUCE"] = args.shm_allreduce  # read by worker_sdk only; Python ignores it
    sides = ("C++", "Python")
    plan = {}
    for c in cfgs:
        dims, batch, steps, warmup, target = CONFIGS[c]
        plan[c] = (max(2, round(steps * args.steps_scale)), max(1, round(warmup * args.steps_scale)))

    subreaper = harness.become_subreaper()
    if args.device == "cuda":
        comm = "both all-reduce through NCCL"
    else:
        comm = (f"C++ all-reduce through {'shared memory' if args.shm_allreduce == '1' else 'Gloo'}, "
                "Python through Gloo")
    print(f"bench_ddp: {args.nproc} rank(s) on {args.device}, under {os.path.relpath(args.launch, REPO_ROOT)}; "
          f"{comm}; "
          f"{args.reps} interleaved rep(s) per side and config; CPUs: {os.cpu_count()}; "
          f"subreaper: {'yes' if subreaper else 'no'}")
    load_before = loadavg()
    print(f"load average before: {load_before}")
    sys.stdout.flush()

    samples = {c: {s: [] for s in sides} for c in cfgs}
    argvs = {}
    threads = set()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_ddp.") as tmp:
        if not args.no_warmup_run:
            for s in sides:  # loads libtorch / the Python torch package into the page cache
                run_train(args, env, tmp, s, cfgs[0], 10, 2, "warm")
        for rep in range(args.reps):
            for ci, c in enumerate(cfgs):
                steps, warmup = plan[c]
                order = sides if (rep + ci) % 2 == 0 else sides[::-1]
                for s in order:
                    smp, argv = run_train(args, env, tmp, s, c, steps, warmup, str(rep))
                    samples[c][s].append(smp)
                    argvs[(c, s)] = argv
                    threads.add(smp.threads)
                    print(f"  rep {rep + 1}/{args.reps} config {c} {s:6s} {smp.steps_per_s:9.3f} steps/s  "
                          f"loss {smp.loss:.6f}  wall {smp.wall_s:5.2f} s  load {loadavg()}")
                    sys.stdout.flush()
    elapsed = time.perf_counter() - t_start
    load_after = loadavg()

    print()
    print("commands (one measured run each):")
    for c in cfgs:
        for s in sides:
            print(f"  {c} {s:6s}: {' '.join(os.path.relpath(x, REPO_ROOT) if os.path.isabs(x) else x for x in argvs[(c, s)])}")
    print(f"  env: PYTHON_EXEC={args.python}; launch set threads: {' | '.join(sorted(threads))}")
    print()

    head = ["config", "dims / batch", "steps (warm-up)", "C++ steps/s median [min..max]",
            "Python steps/s median [min..max]", "ratio C++/Py", "paired ratios [min..max]", "target", "result"]
    rows, loss_rows, mismatch = [], [], False
    for c in cfgs:
        dims, batch, _, _, target = CONFIGS[c]
        steps, warmup = plan[c]
        cp = [x.steps_per_s for x in samples[c]["C++"]]
        py = [x.steps_per_s for x in samples[c]["Python"]]
        mc, mp = statistics.median(cp), statistics.median(py)
        ratio = mc / mp
        paired = [a / b for a, b in zip(cp, py)]
        rows.append([c, f"{dims} / {batch}", f"{steps} ({warmup})",
                     f"{mc:.2f} [{min(cp):.2f}..{max(cp):.2f}]", f"{mp:.2f} [{min(py):.2f}..{max(py):.2f}]",
                     f"{ratio:.2f}x", f"{min(paired):.2f}..{max(paired):.2f}", f">= {target:.1f}x",
                     "met" if ratio >= target else "MISSED"])
        lc = sorted({x.loss for x in samples[c]["C++"]})
        lp = sorted({x.loss for x in samples[c]["Python"]})
        worst = max(rel_diff(a, b) for a in lc for b in lp)
        ok = worst <= args.loss_rtol
        mismatch |= not ok
        loss_rows.append([c, ", ".join(f"{v:.6f}" for v in lc), ", ".join(f"{v:.6f}" for v in lp),
                          f"{worst:.2e}", f"<= {args.loss_rtol:g}", "ok" if ok else "MISMATCH"])
    print_table(head, rows)
    print()
    print("loss cross-check (final loss of rank 0; distinct values over all runs):")
    print_table(["config", "C++ loss", "Python loss", "max rel diff", "allowed", "result"], loss_rows)
    print()
    wall_c = {c: statistics.median(x.wall_s for x in samples[c]["C++"]) for c in cfgs}
    wall_p = {c: statistics.median(x.wall_s for x in samples[c]["Python"]) for c in cfgs}
    print("median wall time per run (launch start to exit, incl. start-up): " +
          "; ".join(f"{c}: C++ {wall_c[c]:.2f} s, Python {wall_p[c]:.2f} s" for c in cfgs))
    print(f"load average before: {load_before}   after: {load_after}   (total {elapsed:.0f} s)")
    if mismatch:
        print("ERROR: C++ and Python losses differ: the two sides did not run the same computation")
        return 2
    return 0


if __name__ == "__main__":
    harness.run_main(main, "bench_ddp", interrupted_code=1)
