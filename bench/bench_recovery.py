#!/usr/bin/python3
"""Recovery benchmark: launch cold (--warm-start=false), launch --warm-start and torchrun (torch 1.13,
bench/torchrun_patched.py), one run.

  1. death -> next step: a 2-rank Python Gloo DDP job (bench/recovery_worker.py) whose rank 1
     SIGKILLs itself at step 10, --max-restarts=1: from the death to the first step every rank
     of the new attempt has finished. Also from the death to the new workers' first line and to
     the end of their init_process_group.     target: torchrun / (launch --warm-start) >= 5x
  2. plain start: 2 ranks started with --max-restarts=0, init_process_group from the last rank's
     call to the last rank's return, in each of --starts runs.    target: launch's worst <= 0.2 s

Usage (as the README says):
    /usr/bin/python3 bench/bench_recovery.py [--runs 5] [--starts 20] [--skip-torchrun]
"""
import argparse
import os
import statistics
import sys
import tempfile

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
import harness  # noqa: E402

WORKER = os.path.join(BENCH_DIR, "recovery_worker.py")


def read_stamps(path):
    out = []
    with open(path) as f:
        for line in f:
            out.append(line.split())
    return out


def recovery(stamps):
    death = [float(s[2]) for s in stamps if s[0] == "death"]
    if len(death) != 1:
        raise harness.RunFailed(f"expected one death stamp, got {len(death)}")
    t = death[0]
    starts = [float(s[3]) for s in stamps if s[0] == "start" and s[2] == "1"]
    inits = [float(s[4]) for s in stamps if s[0] == "init" and s[2] == "1"]
    firsts = [float(s[4]) for s in stamps if s[0] == "step" and s[2] == "1" and s[3] == "1"]
    if len(starts) != 2 or len(inits) != 2 or len(firsts) != 2:
        raise harness.RunFailed(f"attempt 1 incomplete: {len(starts)} starts, {len(inits)} inits, {len(firsts)} first steps")
    return min(starts) - t, max(inits) - t, max(firsts) - t


def plain_init(stamps):
    """init_process_group as the job sees it: from the last rank's call to the last rank's return
    (a rank that calls it early waits for the other's import of torch, which is not the store's)."""
    inits = [(float(s[3]), float(s[4])) for s in stamps if s[0] == "init"]
    if len(inits) != 2:
        raise harness.RunFailed(f"expected 2 init stamps, got {len(inits)}")
    return max(e for _, e in inits) - max(b for b, _ in inits)


def run(argv, env, log, timeout):
    r = harness.run_once(argv, env, timeout, log, leak_marker=WORKER, on_timeout=lambda *a: harness.RunFailed(f"timed out: {a[0]}"),
                         on_leak=lambda argv, leaked: harness.RunFailed(f"left processes behind: {leaked}"))
    if r.code != 0:
        raise harness.RunFailed(f"{argv[0]} exited {r.code}; log {log}:\n{harness.tail(log)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", default=os.path.join(BENCH_DIR, "..", "build", "bin", "launch"))
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch (workers and torchrun)")
    ap.add_argument("--runs", type=int, default=5, help="recovery runs per launcher (default 5)")
    ap.add_argument("--starts", type=int, default=20, help="plain starts per launcher (default 20)")
    ap.add_argument("--skip-torchrun", action="store_true")
    ap.add_argument("--torchrun-monitor-interval", type=float, default=0.1,
                    help="torchrun's --monitor_interval (default 0.1 s; torchrun's own default is 5 s)")
    args = ap.parse_args()
    if args.runs < 1 or args.starts < 1:
        raise harness.HarnessError("--runs and --starts must be >= 1")
    if not os.access(args.launch, os.X_OK):
        raise harness.HarnessError(f"--launch {args.launch}: not executable (build first)")
    harness.become_subreaper()
    launchers = {"launch": [args.launch, "--nproc-per-node=2", "--warm-start=false"],
                 "warm": [args.launch, "--nproc-per-node=2", "--warm-start"]}
    if not args.skip_torchrun:
        # torchrun looks at its workers every --monitor_interval (5 s by default): at 0.1 s its
        # restart is timed by its machinery, not by where the death fell in its poll period.
        launchers["torchrun"] = [args.python, os.path.join(BENCH_DIR, "torchrun_patched.py"), "--nproc_per_node=2",
                                 f"--monitor_interval={args.torchrun_monitor_interval}"]
    tmp = tempfile.mkdtemp(prefix="bench-recovery-")
    results = {}
    for name, base in launchers.items():
        rec, inits = [], []
        for i in range(args.runs + 1):  # the first warms the page cache
            stamp = os.path.join(tmp, f"{name}-rec-{i}")
            env = dict(os.environ, STAMP_FILE=stamp, KILL_AT="10", STEPS="20", PYTHON_EXEC=args.python)
            run(base + ["--max_restarts=1", WORKER], env, stamp + ".log", 300)
            if i:
                rec.append(recovery(read_stamps(stamp)))
        for i in range(args.starts):
            stamp = os.path.join(tmp, f"{name}-start-{i}")
            env = dict(os.environ, STAMP_FILE=stamp, KILL_AT="0", STEPS="1", PYTHON_EXEC=args.python)
            run(base + ["--max_restarts=0", WORKER], env, stamp + ".log", 300)
            inits.append(plain_init(read_stamps(stamp)))
        results[name] = (rec, inits)
        print(f"{name}: death -> first line, init done, next step: " + "; ".join(f"{a:.3f} {b:.3f} {c:.3f}" for a, b, c in rec) + " s; plain init_process_group "
              f"median {statistics.median(inits):.3f} s, worst {max(inits):.3f} s", flush=True)

    def med(name, k):
        return statistics.median(r[k] for r in results[name][0])

    have = "torchrun" in results
    print()
    print("launch: cold starts (--warm-start=false); warm: launch --warm-start (the default); ratios are torchrun's time over launch's")
    print(f"{'metric (median of runs)':36} {'launch':>8} {'warm':>8} {'torchrun':>9} {'t/launch':>9} {'t/warm':>7}  target")
    for k, label in [(0, "death -> new workers' first line"), (1, "death -> init_process_group done"),
                     (2, "death -> next step")]:
        l, w = med("launch", k), med("warm", k)
        t = med("torchrun", k) if have else None
        target = ""
        if k == 2:
            target = ("torchrun/warm >= 5x: " + ("PASS" if t / w >= 5 else "FAIL")) if have else "not measured"
        print(f"{label:36} {l:7.3f}s {w:7.3f}s " + (f"{t:8.3f}s {t / l:8.2f}x {t / w:6.2f}x" if have else f"{'-':>9} {'-':>9} {'-':>7}")
              + f"  {target}")
    for label, f in [("worst", max), ("median", statistics.median)]:
        li, wi = f(results["launch"][1]), f(results["warm"][1])
        ti = f(results["torchrun"][1]) if have else None
        target = f"launch, warm <= 0.2 s: {'PASS' if max(li, wi) <= 0.2 else 'FAIL'}" if label == "worst" else ""
        print(f"{'plain init_process_group, ' + label + ' of ' + str(args.starts):36} {li:7.3f}s {wi:7.3f}s "
              + (f"{ti:8.3f}s" if have else f"{'-':>9}") + f"{'':20}  {target}")


if __name__ == "__main__":
    try:
        main()
    except (harness.HarnessError, harness.RunFailed) as e:
        print(f"bench_recovery.py: {e}", file=sys.stderr)
        sys.exit(1)
