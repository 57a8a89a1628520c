#!/usr/bin/python3
"""Side-by-side benchmark of `launch` and torchrun (torch 1.13, via bench/torchrun_patched.py).

Measures, for both launchers:
  1. wall time of a 2-worker /bin/true job                    target: torchrun/launch >= 100x
  2. peak RSS of the launcher process (os.wait4 ru_maxrss)    target: launch <= 20 MiB
  3. worker-crash -> restarted-worker latency (2 workers, rank 1 crashes, one restart)
                                                              target: launch <= 10 ms
  4. workers' exit -> launcher's exit (2 workers that stamp the time and exit 0)
                                                              target: launch <= 5 ms
  5. start-up alone: `launch --version` (torchrun has none: `torchrun --help`)
                                                              target: launch <= 5 ms
  6. threads and listening sockets the launcher starts for row 1's job (strace -f; counted
     only where strace is installed)                          target: launch <= 2 threads, 0 listeners

Standard library only. Run with Debian's Python (it has torch 1.13):
    /usr/bin/python3 bench/bench_launch.py [--runs N] [--torchrun-runs N] [--skip-torchrun]

Exit status: 0 when every row was measured (a missed target prints MISSED but still exits 0);
1 when something could not be measured (bad arguments, a missing binary, a launcher that hung,
died from a signal, returned an unexpected exit code or left processes behind).
"""
import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)

sys.path.insert(0, BENCH_DIR)
import harness  # noqa: E402  (bench/harness.py, next to this script)

MIB = 1024.0  # ru_maxrss is in KiB on Linux

WALL_RATIO_TARGET = 100.0
RSS_TARGET_MIB = 20.0
RESTART_TARGET_MS = 10.0
EXIT_TARGET_MS = 5.0
VERSION_TARGET_MS = 5.0
# What a single-node job needs, whatever its workers: the console writer, the workers' store
# (MASTER_PORT, whose listener torchrun's agent has too), the exit-notice watcher and the
# --monitor-interval sampler. No gRPC, no coordinator server, no thread per call.
THREADS_TARGET = 4
LISTENERS_TARGET = 1

# Variables a parent launcher may have set; the launchers under test must not inherit them.
_SCRUB_PREFIXES = ("TORCHELASTIC_",)
_SCRUB_NAMES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
}


# Process handling lives in harness.py (shared with bench_ddp.py).
HarnessError = harness.HarnessError  # the benchmark itself could not run (bad arguments, missing binary...)
RunFailed = harness.RunFailed        # a launcher run misbehaved: timeout, signal, exit code, stamps


def _tail(path, n=25):
    return harness.tail(path, n, missing="<no output>")


def _timeout_failed(argv, timeout, log_path):
    return RunFailed(f"timed out after {timeout:.0f}s (killed); command:\n    {' '.join(argv)}"
                     f"\n  output tail:\n{_tail(log_path)}")


def _leak_failed(argv, leaked):
    return RunFailed(f"left {len(leaked)} process(es) running after it exited "
                     f"(killed them): {leaked}; command:\n    {' '.join(argv)}")


def run_once(argv, env, timeout, log_path, leak_marker=None, stop_grace=5.0):
    """harness.run_once raising RunFailed: on a timeout (SIGTERM, then SIGKILL of the launcher
    and its descendants after stop_grace) and when the launcher left a process behind (a
    descendant re-parented to us, or a process whose argv holds leak_marker)."""
    return harness.run_once(argv, env, timeout, log_path, leak_marker=leak_marker,
                            stop_grace=stop_grace, poll_s=0.0005, leftover_tries=50,
                            on_timeout=_timeout_failed, on_leak=_leak_failed)


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------

class Launcher:
    def __init__(self, name, base_argv, true_flags, restart_flags, version_flags, timeout):
        self.name = name
        self.base = base_argv
        self.true_flags = true_flags
        self.restart_flags = restart_flags
        self.version_flags = version_flags
        self.timeout = timeout


def bench_true(lch, runs, env, tmp):
    """Scenario 1+2: wall time and peak RSS of a 2-worker /bin/true job."""
    argv = lch.base + lch.true_flags + ["/bin/true"]
    log = os.path.join(tmp, f"{lch.name}-true.log")
    walls, rss = [], []
    for i in range(runs + 1):  # first run warms caches and is not counted
        r = run_once(argv, env, lch.timeout, log)
        if r.code != 0:
            raise RunFailed(f"exit code {r.code} (expected 0); command:\n    {' '.join(argv)}"
                            f"\n  output tail:\n{_tail(log)}")
        if i:
            walls.append(r.wall_s)
            rss.append(r.maxrss_kib)
    return {"argv": argv, "walls": walls, "rss": rss}


def _read_stamps(path):
    stamps = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    stamps.append((int(parts[0]), int(parts[1]), int(parts[2])))
    except OSError:
        pass
    return stamps


def bench_restart(lch, runs, env, tmp, test_worker):
    """Scenario 3: crash of rank 1 -> first worker of the restarted group.

    Each worker runs: test_worker --stamp F --fail-rank 1 1 --sleep 0
      attempt 0: rank 1 stamps then exits 1 at once (its stamp is the crash time); rank 0
                 stamps and sleeps until the launcher stops it.
      attempt 1: the same, so the job finally fails (expected: non-zero exit). test_worker's
                 actions are unconditional steps, so "rank 1 fails only on attempt 0 while rank 0
                 sleeps" cannot be expressed; the latency measured is unaffected.
    latency = min(stamp of attempt 1) - stamp(rank 1, attempt 0)."""
    log = os.path.join(tmp, f"{lch.name}-restart.log")
    lat_ms, rss = [], []
    argv = None
    for i in range(runs + 1):  # first run is warm-up
        stamp = os.path.join(tmp, f"{lch.name}-stamps-{i}.txt")
        argv = lch.base + lch.restart_flags + [
            test_worker, "--stamp", stamp, "--fail-rank", "1", "1", "--sleep", "0"]
        r = run_once(argv, env, lch.timeout, log, leak_marker=stamp)
        stamps = _read_stamps(stamp)
        if r.code <= 0:
            raise RunFailed(f"exit code {r.code} (expected a non-zero exit: rank 1 fails again "
                            f"after the one allowed restart); command:\n    {' '.join(argv)}"
                            f"\n  stamps: {stamps}\n  output tail:\n{_tail(log)}")
        crash = [t for rk, rs, t in stamps if rk == 1 and rs == 0]
        again = [t for rk, rs, t in stamps if rs == 1]
        extra = [s for s in stamps if s[1] not in (0, 1)]
        if len(crash) != 1 or not again or extra:
            raise RunFailed(f"unexpected stamps {stamps} (want one rank-1 stamp of restart 0, "
                            f"stamps of restart 1, nothing else); command:\n    {' '.join(argv)}"
                            f"\n  output tail:\n{_tail(log)}")
        if i:
            lat_ms.append((min(again) - crash[0]) / 1e6)
            rss.append(r.maxrss_kib)
    return {"argv": argv, "lat_ms": lat_ms, "rss": rss}


def bench_exit(lch, runs, env, tmp, test_worker):
    """Scenario 4: the workers' exit -> the launcher's exit. Each worker runs
    `test_worker --stamp F` (stamps CLOCK_REALTIME, then exits 0); latency = the launcher's reap
    time (CLOCK_REALTIME, from a pidfd wake-up) minus the latest stamp."""
    log = os.path.join(tmp, f"{lch.name}-exit.log")
    lat_ms = []
    argv = None
    for i in range(runs + 1):  # first run is warm-up
        stamp = os.path.join(tmp, f"{lch.name}-exit-stamps-{i}.txt")
        argv = lch.base + lch.true_flags + [test_worker, "--stamp", stamp]
        r = run_once(argv, env, lch.timeout, log, leak_marker=stamp)
        stamps = _read_stamps(stamp)
        if r.code != 0 or len(stamps) != 2:
            raise RunFailed(f"exit code {r.code}, stamps {stamps} (expected 0 and two stamps); command:\n"
                            f"    {' '.join(argv)}\n  output tail:\n{_tail(log)}")
        if i:
            lat_ms.append((r.exit_ns - max(t for _, _, t in stamps)) / 1e6)
    return {"argv": argv, "lat_ms": lat_ms}


def bench_version(lch, runs, env, tmp):
    """Scenario 5: start-up and exit with no job: `launch --version`, `torchrun --help`."""
    argv = lch.base + lch.version_flags
    log = os.path.join(tmp, f"{lch.name}-version.log")
    walls = []
    for i in range(runs + 1):  # first run is warm-up
        r = run_once(argv, env, lch.timeout, log)
        if r.code != 0:
            raise RunFailed(f"exit code {r.code} (expected 0); command:\n    {' '.join(argv)}"
                            f"\n  output tail:\n{_tail(log)}")
        if i:
            walls.append(r.wall_s)
    return {"argv": argv, "walls": walls}


def bench_threads(lch, env, tmp):
    """Scenario 6: threads (clone with CLONE_THREAD) and listening sockets (listen) of row 1's
    job, counted by strace -f over the launcher and its workers (/bin/true starts none)."""
    strace = shutil.which("strace")
    if not strace:
        raise RunFailed("strace is not installed: threads not counted")
    trace = os.path.join(tmp, f"{lch.name}-strace.txt")
    log = os.path.join(tmp, f"{lch.name}-threads.log")
    argv = [strace, "-f", "-qq", "-e", "trace=clone,clone3,listen", "-e", "signal=none", "-o", trace] + \
        lch.base + lch.true_flags + ["/bin/true"]
    for _ in range(2):  # the first run warms caches
        r = run_once(argv, env, lch.timeout * 4, log)
        if r.code != 0:
            raise RunFailed(f"exit code {r.code} (expected 0); command:\n    {' '.join(argv)}"
                            f"\n  output tail:\n{_tail(log)}")
    with open(trace) as f:
        lines = f.read().splitlines()
    threads = sum(1 for l in lines if ("clone(" in l or "clone3(" in l) and "CLONE_THREAD" in l)
    listeners = sum(1 for l in lines if " listen(" in l and "= 0" in l)
    return {"argv": argv, "threads": threads, "listeners": listeners}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def _fmt_ms(s):
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _spread(vals, fmt):
    return f"min {fmt(min(vals))}, max {fmt(max(vals))}"


def print_table(rows):
    head = ["metric", "launch", "torchrun", "torchrun/launch", "target", "result"]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print(line)
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", default=os.path.join(REPO_ROOT, "build", "bin", "launch"))
    ap.add_argument("--test-worker", default=os.path.join(REPO_ROOT, "build", "bin", "test_worker"))
    ap.add_argument("--runs", type=int, default=20, help="measured runs per scenario for launch (default 20)")
    ap.add_argument("--torchrun-runs", type=int, default=5, help="measured runs per scenario for torchrun (default 5)")
    ap.add_argument("--skip-torchrun", action="store_true", help="measure launch only")
    ap.add_argument("--torchrun-python", default="/usr/bin/python3",
                    help="interpreter with torch 1.13 for bench/torchrun_patched.py (default /usr/bin/python3)")
    ap.add_argument("--launch-timeout", type=float, default=30.0, help="seconds per launch run before it counts as hung")
    ap.add_argument("--torchrun-timeout", type=float, default=120.0, help="seconds per torchrun run")
    args = ap.parse_args()

    if args.runs < 1 or args.torchrun_runs < 1:
        raise HarnessError("--runs and --torchrun-runs must be >= 1")
    for what, path in (("--launch", args.launch), ("--test-worker", args.test_worker)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise HarnessError(f"{what} {path}: not an executable file (build it: "
                               f"ninja -C build launch test_worker)")
    args.launch = os.path.abspath(args.launch)
    args.test_worker = os.path.abspath(args.test_worker)
    wrapper = os.path.join(BENCH_DIR, "torchrun_patched.py")
    if not args.skip_torchrun:
        if not os.access(args.torchrun_python, os.X_OK):
            raise HarnessError(f"--torchrun-python {args.torchrun_python}: not executable")
        if not os.path.isfile(wrapper):
            raise HarnessError(f"{wrapper} is missing")

    env = {k: v for k, v in os.environ.items()
           if k not in _SCRUB_NAMES and not k.startswith(_SCRUB_PREFIXES)}
    env.pop("PYTHONPATH", None)

    launchers = [Launcher(
        "launch", [args.launch],
        ["--nproc-per-node=2", "--no-python"],
        ["--nproc-per-node=2", "--max-restarts=1", "--no-python"],
        ["--version"],
        args.launch_timeout)]
    if not args.skip_torchrun:
        launchers.append(Launcher(
            "torchrun", [args.torchrun_python, wrapper],
            ["--nproc_per_node=2", "--monitor_interval", "0.1", "--no_python"],
            ["--nproc_per_node=2", "--max_restarts=1", "--monitor_interval", "0.1", "--no_python"],
            ["--help"],
            args.torchrun_timeout))

    subreaper = harness.become_subreaper()
    print(f"bench_launch: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, subreaper={'on' if subreaper else 'off'}")
    print(f"  launch:      {args.launch}  ({args.runs} runs per scenario, +1 warm-up)")
    if args.skip_torchrun:
        print("  torchrun:    skipped (--skip-torchrun): ratios not measured")
    else:
        print(f"  torchrun:    {args.torchrun_python} {wrapper}  ({args.torchrun_runs} runs per scenario, +1 warm-up)")
    print(f"  test_worker: {args.test_worker}")
    print("  load average at start: %.2f %.2f %.2f (other CPU load skews every number)" % os.getloadavg())
    sys.stdout.flush()

    tmp = tempfile.mkdtemp(prefix="bench_launch-")
    res, errors = {}, []
    try:
        # Harness overhead: spawn + wait of /bin/true itself through the same code path.
        base = [run_once(["/bin/true"], env, 10, os.path.join(tmp, "true.log")).wall_s
                for _ in range(args.runs + 1)][1:]
        for lch in launchers:
            n = args.runs if lch.name == "launch" else args.torchrun_runs
            for key, fn in (("true", lambda: bench_true(lch, n, env, tmp)),
                            ("restart", lambda: bench_restart(lch, n, env, tmp, args.test_worker)),
                            ("exit", lambda: bench_exit(lch, n, env, tmp, args.test_worker)),
                            ("version", lambda: bench_version(lch, n, env, tmp)),
                            ("threads", lambda: bench_threads(lch, env, tmp))):
                print(f"  running {lch.name} / {key} ...", flush=True)
                try:
                    res[(lch.name, key)] = fn()
                except RunFailed as e:
                    errors.append(f"{lch.name} / {key}: {e}")
                    print(f"    FAILED: {e}", flush=True)
    finally:
        harness.cleanup_leftovers(tmp, tries=50)
        shutil.rmtree(tmp, ignore_errors=True)

    have_tr = not args.skip_torchrun
    na_ratio = "not measured" if args.skip_torchrun else "n/a"
    rows = []

    def cell(name, key, fn):
        r = res.get((name, key))
        if r is None:
            return None, ("skipped" if name == "torchrun" and not have_tr else "FAILED")
        v = fn(r)
        return v, None

    def verdict(ok):
        return "met" if ok else "MISSED"

    # 1. wall time
    lw, le = cell("launch", "true", lambda r: statistics.median(r["walls"]))
    tw, te = cell("torchrun", "true", lambda r: statistics.median(r["walls"]))
    ratio = tw / lw if lw and tw else None
    rows.append(["1. wall time, 2x /bin/true (median)",
                 _fmt_ms(lw) if lw is not None else le,
                 _fmt_ms(tw) if tw is not None else te,
                 f"{ratio:.1f}x" if ratio else na_ratio,
                 f"ratio >= {WALL_RATIO_TARGET:.0f}x",
                 verdict(ratio >= WALL_RATIO_TARGET) if ratio else
                 ("FAILED" if lw is None or have_tr else "not measured")])
    # 2. peak RSS
    lr, le = cell("launch", "true", lambda r: max(r["rss"]) / MIB)
    tr, te = cell("torchrun", "true", lambda r: max(r["rss"]) / MIB)
    rows.append(["2. peak RSS of launcher (max of runs)",
                 f"{lr:.1f} MiB" if lr is not None else le,
                 f"{tr:.1f} MiB" if tr is not None else te,
                 f"{tr / lr:.1f}x" if lr and tr else na_ratio,
                 f"launch <= {RSS_TARGET_MIB:.0f} MiB",
                 verdict(lr <= RSS_TARGET_MIB) if lr is not None else "FAILED"])
    # 3. crash -> restart latency
    ll, le = cell("launch", "restart", lambda r: statistics.median(r["lat_ms"]))
    tl, te = cell("torchrun", "restart", lambda r: statistics.median(r["lat_ms"]))
    rows.append(["3. crash -> restarted worker (median)",
                 f"{ll:.2f} ms" if ll is not None else le,
                 f"{tl:.2f} ms" if tl is not None else te,
                 f"{tl / ll:.1f}x" if ll and tl else na_ratio,
                 f"launch <= {RESTART_TARGET_MS:.0f} ms",
                 verdict(ll <= RESTART_TARGET_MS) if ll is not None else "FAILED"])
    # informational
    lr3, le = cell("launch", "restart", lambda r: max(r["rss"]) / MIB)
    tr3, te = cell("torchrun", "restart", lambda r: max(r["rss"]) / MIB)
    rows.append(["   peak RSS in the restart runs (info)",
                 f"{lr3:.1f} MiB" if lr3 is not None else le,
                 f"{tr3:.1f} MiB" if tr3 is not None else te,
                 f"{tr3 / lr3:.1f}x" if lr3 and tr3 else na_ratio, "-", "-"])

    # 4. workers' exit -> launcher's exit
    lx, le = cell("launch", "exit", lambda r: statistics.median(r["lat_ms"]))
    tx, te = cell("torchrun", "exit", lambda r: statistics.median(r["lat_ms"]))
    rows.append(["4. workers' exit -> launcher's exit (median)",
                 f"{lx:.2f} ms" if lx is not None else le,
                 f"{tx:.2f} ms" if tx is not None else te,
                 f"{tx / lx:.1f}x" if lx and tx else na_ratio,
                 f"launch <= {EXIT_TARGET_MS:.0f} ms",
                 verdict(lx <= EXIT_TARGET_MS) if lx is not None else "FAILED"])
    # 5. start-up alone
    lv, le = cell("launch", "version", lambda r: statistics.median(r["walls"]))
    tv, te = cell("torchrun", "version", lambda r: statistics.median(r["walls"]))
    rows.append(["5. --version (torchrun: --help) (median)",
                 _fmt_ms(lv) if lv is not None else le,
                 _fmt_ms(tv) if tv is not None else te,
                 f"{tv / lv:.1f}x" if lv and tv else na_ratio,
                 f"launch <= {VERSION_TARGET_MS:.0f} ms",
                 verdict(lv * 1000 <= VERSION_TARGET_MS) if lv is not None else "FAILED"])
    # 6. threads and listeners
    lt, le = cell("launch", "threads", lambda r: r["threads"])
    tt, te = cell("torchrun", "threads", lambda r: r["threads"])
    rows.append(["6. threads started, row 1's job",
                 lt if lt is not None else le, tt if tt is not None else te,
                 f"{tt / lt:.1f}x" if lt and tt else na_ratio,
                 f"launch <= {THREADS_TARGET}",
                 verdict(lt <= THREADS_TARGET) if lt is not None else "FAILED"])
    ln, le = cell("launch", "threads", lambda r: r["listeners"])
    tn, te = cell("torchrun", "threads", lambda r: r["listeners"])
    rows.append(["   listening sockets, row 1's job",
                 ln if ln is not None else le, tn if tn is not None else te, "-",
                 f"launch <= {LISTENERS_TARGET}",
                 verdict(ln <= LISTENERS_TARGET) if ln is not None else "FAILED"])

    print("  load average at end:   %.2f %.2f %.2f" % os.getloadavg())
    print()
    print_table(rows)
    print(f"harness overhead: spawning /bin/true directly takes {_fmt_ms(statistics.median(base))} (median), "
          f"included in row 1's wall times")
    print("ru_maxrss comes from os.wait4 on the launcher's pid: the launcher plus any descendant it "
          "reaped (here /bin/true and test_worker, far smaller)")
    for name in ("launch", "torchrun"):
        r1, r3 = res.get((name, "true")), res.get((name, "restart"))
        if r1:
            print(f"{name:8s} wall: {_spread(r1['walls'], _fmt_ms)}; rss: min {min(r1['rss']) / MIB:.1f} MiB"
                  f"; runs {len(r1['walls'])}")
        if r3:
            print(f"{name:8s} restart latency: {_spread(r3['lat_ms'], lambda v: f'{v:.2f} ms')}; "
                  f"runs {len(r3['lat_ms'])}")
    print("commands:")
    for (name, key), r in sorted(res.items()):
        print(f"  {name}/{key}: {' '.join(r['argv'])}")
    if errors:
        print(f"\n{len(errors)} scenario(s) could not be measured (see FAILED above):")
        for e in errors:
            print("  - " + e.splitlines()[0])
        return 1
    return 0


if __name__ == "__main__":
    harness.run_main(main, "bench_launch")
