#!/usr/bin/python3
"""Checkpoint benchmark for train_mlp (worker_sdk's C++ reference workload), one run.

  1. death -> next step: 2 ranks, checkpoints every 5 steps, rank 1 SIGKILLs itself at step 122
     (about 3 s into the run, once the next attempt's standbys, made when every rank trains, are
     ready), --max-restarts=1: from the death to the first step every rank of the new attempt
     has finished (train_mlp --stamp-file). Side by side:
       torchrun    torchrun (torch 1.13, bench/torchrun_patched.py) running train_mlp: a cold
                   start, the checkpoint read from disk
       cold        launch --warm-start=false, train_mlp --checkpoint-memory=false (the same)
       launch      launch's defaults: warm C++ workers (LAUNCH_SDK_WARM_START), checkpoints kept
                   in the agent's memory               target: launch <= 0.1 s
  2. checkpoint stall: 1 rank, a model of --stall-dims (default 784,4096,4096,4096,10: 147 MB of
     parameters, 294 MB with SGD's momentum), a save every --stall-every steps (default 8: more
     time than the background write of the last save takes here, else the next save waits for
     it, which is the disk's bound and not the copy's): the time Save takes in the
     training loop, synchronous (--checkpoint-memory=false: snapshot, checksum, write, fsync,
     rename) against in-memory (the snapshot only; the file is written in the background). A
     job's first save, which also allocates the memory, is shown apart from the later ones.
                                            target: memory / synchronous <= 10% (later saves)

Usage (as the README says):
    /usr/bin/python3 bench/bench_checkpoint.py [--runs 5] [--skip-torchrun]
"""
import argparse
import os
import statistics
import sys
import tempfile

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
import harness  # noqa: E402


def stamps(path):
    with open(path) as f:
        return [line.split() for line in f if line.strip()]


def recovery(rows):
    """Death -> new attempt's first step on every rank; also -> init, -> resumed and -> DDP built."""
    death = [float(r[-1]) for r in rows if r[0] == "death"]
    if len(death) != 1:
        raise harness.RunFailed(f"expected one death stamp, got {len(death)}")
    d = death[0]

    def attempt1(event, value=None):  # the times of attempt 1's stamps of this event (and value)
        return [float(r[-1]) for r in rows if r[0] == event and r[2] == "1" and (value is None or r[3] == value)]

    resumed_at = {r[3] for r in rows if r[0] == "resumed" and r[2] == "1"}
    if len(resumed_at) != 1:
        raise harness.RunFailed(f"attempt 1's ranks resumed from different steps: {sorted(resumed_at)}")
    next_step = str(int(resumed_at.pop()) + 1)
    first, inits, resumed, built = attempt1("step", next_step), attempt1("init"), attempt1("resumed"), attempt1("built")
    if len(first) != 2 or len(inits) != 2 or len(resumed) != 2 or len(built) != 2:
        raise harness.RunFailed(f"attempt 1 incomplete: {len(inits)} inits, {len(resumed)} resumes, {len(built)} DDPs, "
                                f"{len(first)} first steps")
    return max(inits) - d, max(resumed) - d, max(built) - d, max(first) - d


def run(argv, env, log, timeout):
    r = harness.run_once(argv, env, timeout, log, leak_marker="train_mlp",
                         on_timeout=lambda *a: harness.RunFailed(f"timed out: {a[0]}"),
                         on_leak=lambda argv, leaked: harness.RunFailed(f"left processes behind: {leaked}"))
    if r.code != 0:
        raise harness.RunFailed(f"{argv[0]} exited {r.code}; log {log}:\n{harness.tail(log)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    build = os.path.join(BENCH_DIR, "..", "build", "bin")
    ap.add_argument("--launch", default=os.path.join(build, "launch"))
    ap.add_argument("--train-mlp", default=os.path.join(build, "train_mlp"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch, for torchrun")
    ap.add_argument("--runs", type=int, default=5, help="recovery runs per launcher (default 5)")
    ap.add_argument("--stall-dims", default="784,4096,4096,4096,10")
    ap.add_argument("--stall-saves", type=int, default=5)
    ap.add_argument("--stall-every", type=int, default=8, help="steps between saves in the stall runs")
    ap.add_argument("--skip-torchrun", action="store_true")
    args = ap.parse_args()
    if args.runs < 1 or args.stall_saves < 2 or args.stall_every < 1:
        raise harness.HarnessError("--runs must be >= 1, --stall-saves >= 2 and --stall-every >= 1")
    for exe in (args.launch, args.train_mlp):
        if not os.access(exe, os.X_OK):
            raise harness.HarnessError(f"{exe}: not executable (build first)")
    harness.become_subreaper()
    tmp = tempfile.mkdtemp(prefix="bench-checkpoint-")
    train = ["--dims", "784,1024,1024,10", "--steps", "130", "--checkpoint-every", "5", "--fail-at-step", "122",
             "--print-every", "0"]
    launchers = {
        "cold": [args.launch, "--nproc-per-node=2", "--max-restarts=1", "--warm-start=false", args.train_mlp] + train
        + ["--checkpoint-memory=false"],
        "launch": [args.launch, "--nproc-per-node=2", "--max-restarts=1", args.train_mlp] + train,
    }
    if not args.skip_torchrun:
        launchers["torchrun"] = [args.python, os.path.join(BENCH_DIR, "torchrun_patched.py"), "--nproc_per_node=2",
                                 "--max_restarts=1", "--monitor_interval=0.1", "--no_python", args.train_mlp] + train
    results = {}
    for name, argv in launchers.items():
        rec = []
        for i in range(args.runs + 1):  # the first warms the page cache
            base = os.path.join(tmp, f"{name}-{i}")
            run(argv + ["--checkpoint-dir", base + "-ckpt", "--stamp-file", base + ".stamps"], dict(os.environ),
                base + ".log", 300)
            if i:
                rec.append(recovery(stamps(base + ".stamps")))
        results[name] = rec
        print(f"{name}: death -> init, resumed, DDP built, next step: " + "; ".join(" ".join(f"{v:.3f}" for v in r) for r in rec)
              + " s", flush=True)

    stalls = {}
    for name, memory in (("synchronous", "false"), ("memory", "true")):
        base = os.path.join(tmp, f"stall-{name}")
        argv = [args.launch, "--nproc-per-node=1", args.train_mlp, "--dims", args.stall_dims, "--batch", "16",
                "--steps", str(args.stall_every * args.stall_saves), "--checkpoint-every", str(args.stall_every), "--dataset-size", "256",
                "--print-every", "0", "--checkpoint-memory=" + memory, "--checkpoint-dir", base + "-ckpt",
                "--stamp-file", base + ".stamps"]
        run(argv, dict(os.environ), base + ".log", 600)
        stalls[name] = [float(r[4]) for r in stamps(base + ".stamps") if r[0] == "save"]
        size = sum(os.path.getsize(os.path.join(base + "-ckpt", f)) for f in os.listdir(base + "-ckpt")) / len(
            os.listdir(base + "-ckpt"))
        print(f"stall {name}: " + " ".join(f"{s:.4f}" for s in stalls[name]) + f" s per save; files of {size / 1e6:.0f} MB",
              flush=True)

    def med(name, k):
        return statistics.median(r[k] for r in results[name])

    have = "torchrun" in results
    print()
    print("cold: launch --warm-start=false, train_mlp --checkpoint-memory=false; launch: the defaults (warm C++ "
          "workers, checkpoints in memory)")
    print(f"{'metric (median of runs)':30} {'cold':>8} {'launch':>8} {'torchrun':>9} {'cold/launch':>12} "
          f"{'torchrun/launch':>16}  target")
    for k, label in [(0, "death -> Context::Init done"), (1, "death -> checkpoint loaded"), (2, "death -> DDP built"),
                     (3, "death -> next step")]:
        c, l = med("cold", k), med("launch", k)
        t = med("torchrun", k) if have else None
        target = f"launch <= 0.1 s: {'PASS' if l <= 0.1 else 'FAIL'}" if k == 3 else ""
        print(f"{label:30} {c:7.3f}s {l:7.3f}s " + (f"{t:8.3f}s" if have else f"{'-':>9}") + f" {c / l:11.2f}x "
              + (f"{t / l:15.2f}x" if have else f"{'-':>16}") + f"  {target}")
    # A job's first save also allocates its memory (and, synchronous, its page cache): shown apart.
    s0, m0 = stalls["synchronous"][0], stalls["memory"][0]
    s, m = statistics.median(stalls["synchronous"][1:]), statistics.median(stalls["memory"][1:])
    print(f"{'stall, first save of the job':30} {s0:7.3f}s {m0:7.3f}s {'':9} {s0 / m0:11.1f}x")
    print(f"{'stall, later saves (median)':30} {s:7.3f}s {m:7.3f}s {'':9} {s / m:11.1f}x {'':16}  "
          f"memory/synchronous <= 10%: {m / s * 100:.1f}% {'PASS' if m <= 0.1 * s else 'FAIL'}")


if __name__ == "__main__":
    try:
        main()
    except (harness.HarnessError, harness.RunFailed) as e:
        print(f"bench_checkpoint.py: {e}", file=sys.stderr)
        sys.exit(1)
