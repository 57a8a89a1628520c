#!/usr/bin/python3
"""Multi-node benchmarks on loopback: `launch` vs torchrun 1.13 with its c10d rendezvous, side by side.

Each "node" is a launcher process of its own on this machine, both given the same rendezvous
endpoint on 127.0.0.1, so the first one to bind it hosts the coordinator (launch) or the c10d
TCPStore (torchrun), exactly as on a cluster whose endpoint is one of the nodes.

  1. 2-node rendezvous and run of /bin/true (1 worker per node): wall time from the first
     launcher's spawn to the last one's reap.                      target: torchrun/launch >= 40x,
                                                                           launch <= 30 ms
  2. worker failure on node A -> the worker on node B receives SIGTERM (1 worker per node,
     --max-restarts 1): rank 0 stamps the time and exits 1; rank 1 stamps the time SIGTERM
     reaches it (test_worker --stamp-on-term); in the next round every worker exits 0.
                                                                   target: launch <= 0.2 s

Standard library only. Run with Debian's Python (it has torch 1.13):
    /usr/bin/python3 bench/bench_multinode.py [--runs N] [--torchrun-runs N] [--skip-torchrun]

Exit status: 0 when every row was measured (a missed target prints MISSED but still exits 0);
1 when something could not be measured (a missing binary, a launcher that hung, failed, wrote
unexpected stamps or left processes behind).
"""
import argparse
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
import harness  # noqa: E402  (bench/harness.py, next to this script)

WALL_RATIO_TARGET = 40.0
WALL_TARGET_S = 0.030  # launch's own 2-node wall time
STOP_TARGET_S = 0.2

HarnessError = harness.HarnessError
RunFailed = harness.RunFailed


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(argvs, env, timeout, logs, marker):
    """Start one launcher per node (argvs, in order, back to back) and wait for all of them.
    Returns (exit codes, wall seconds from the first spawn to the last reap). Every process
    still running at the timeout or left behind afterwards is killed and makes it RunFailed."""
    started = []
    reaped = set()
    try:
        for argv, log in zip(argvs, logs):
            started.append(harness.spawn(argv, env, log))
        t0 = started[0][1]
        codes, t_end = [], t0
        for pid, _ in started:
            got = harness.wait_exit(pid, max(0.01, timeout - (time.perf_counter() - t0)))
            if got is None:
                raise RunFailed(f"timed out after {timeout:.0f} s (killed); commands:\n    " +
                                "\n    ".join(" ".join(a) for a in argvs) +
                                "".join(f"\n  {log}:\n{harness.tail(log)}" for log in logs))
            status, _, t1 = got
            reaped.add(pid)
            codes.append(os.waitstatus_to_exitcode(status))
            t_end = max(t_end, t1)
    finally:
        for pid, _ in started:
            if pid not in reaped:
                for p in harness.descendants(pid):
                    harness.kill(p, 9)
                harness.kill(pid, 9)
                harness.wait_exit(pid, 5)
        leaked = harness.cleanup_leftovers(marker, tries=50)
    if leaked:
        raise RunFailed(f"left {len(leaked)} process(es) running (killed them): {leaked}")
    return codes, t_end - t0


def read_stamps(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) == 3:
                    out.append((int(p[0]), int(p[1]), int(p[2])))
    except OSError:
        pass
    return out


class Launcher:
    """How one launcher is started as a node: node_argv(port, run_id, extra, program)."""

    def __init__(self, name, node_argv, timeout):
        self.name = name
        self.node_argv = node_argv
        self.timeout = timeout


def bench_true(lch, runs, env, tmp):
    walls = []
    argvs = None
    for i in range(runs + 1):  # the first run is a warm-up
        port, run_id = free_port(), f"bench{i}"
        argvs = [lch.node_argv(port, run_id, [], ["/bin/true"]) for _ in range(2)]
        logs = [os.path.join(tmp, f"{lch.name}-true-{n}.log") for n in range(2)]
        codes, wall = run_nodes(argvs, env, lch.timeout, logs, marker=f"127.0.0.1:{port}")
        if codes != [0, 0]:
            raise RunFailed(f"exit codes {codes} (expected 0, 0); command:\n    {' '.join(argvs[0])}" +
                            "".join(f"\n  {log}:\n{harness.tail(log)}" for log in logs))
        if i:
            walls.append(wall)
    return {"argv": argvs[0], "walls": walls}


def bench_stop(lch, runs, env, tmp, test_worker):
    lat = []
    argvs = None
    for i in range(runs + 1):
        port, run_id = free_port(), f"stop{i}"
        d = os.path.join(tmp, f"{lch.name}-stop-{i}")
        os.mkdir(d)
        fail, term = os.path.join(d, "fail"), os.path.join(d, "term")
        # The second round is told from the first by the pid file's length, not by the restart
        # count: torchrun counts restarts per agent, so its nodes see different counts.
        pids = os.path.join(d, "pids")
        # The SIGTERM stamp is armed first: the stop may come before rank 1 is past --wait-lines.
        worker = [test_worker, "--stamp-on-term", term, "--pid-file", pids, "--wait-lines", pids, "2",
                  "--exit-if-lines", pids, "3", "0", "--stamp", fail, "--fail-rank", "0", "1", "--sleep", "0"]
        argvs = [lch.node_argv(port, run_id, ["--max-restarts=1"], worker) for _ in range(2)]
        logs = [os.path.join(tmp, f"{lch.name}-stop-{n}.log") for n in range(2)]
        codes, _ = run_nodes(argvs, env, lch.timeout, logs, marker=d)
        failed = [t for r, rs, t in read_stamps(fail) if r == 0 and rs == 0]
        stopped = [t for r, rs, t in read_stamps(term) if r == 1 and rs == 0]
        if codes != [0, 0] or len(failed) != 1 or len(stopped) != 1:
            raise RunFailed(f"exit codes {codes} (expected 0, 0), failure stamps {read_stamps(fail)}, "
                            f"SIGTERM stamps {read_stamps(term)}; command:\n    {' '.join(argvs[0])}" +
                            "".join(f"\n  {log}:\n{harness.tail(log)}" for log in logs))
        if i:
            lat.append((stopped[0] - failed[0]) / 1e9)
    return {"argv": argvs[0], "lat": lat}


def fmt_s(s):
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", default=os.path.join(REPO_ROOT, "build", "bin", "launch"))
    ap.add_argument("--test-worker", default=os.path.join(REPO_ROOT, "build", "bin", "test_worker"))
    ap.add_argument("--runs", type=int, default=20, help="measured runs per scenario for launch (default 20)")
    ap.add_argument("--torchrun-runs", type=int, default=3, help="measured runs per scenario for torchrun (default 3)")
    ap.add_argument("--skip-torchrun", action="store_true", help="measure launch only")
    ap.add_argument("--torchrun-python", default="/usr/bin/python3")
    ap.add_argument("--launch-timeout", type=float, default=30.0)
    ap.add_argument("--torchrun-timeout", type=float, default=120.0)
    args = ap.parse_args()
    if args.runs < 1 or args.torchrun_runs < 1:
        raise HarnessError("--runs and --torchrun-runs must be >= 1")
    for what, path in (("--launch", args.launch), ("--test-worker", args.test_worker)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise HarnessError(f"{what} {path}: not an executable file (build it: ninja -C build launch test_worker)")
    launch, test_worker = os.path.abspath(args.launch), os.path.abspath(args.test_worker)
    wrapper = os.path.join(BENCH_DIR, "torchrun_patched.py")

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "LAUNCH_")) and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                         "MASTER_PORT", "LOCAL_RANK", "PYTHONPATH")}

    launchers = [Launcher("launch", lambda port, rid, extra, prog: [
        launch, "--nnodes=2", "--nproc-per-node=1", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={rid}",
        *extra, "--no-python", *prog], args.launch_timeout)]
    if not args.skip_torchrun:
        launchers.append(Launcher("torchrun", lambda port, rid, extra, prog: [
            args.torchrun_python, wrapper, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={rid}", "--monitor_interval=0.1",
            *["--" + e[2:].replace("-", "_") for e in extra], "--no_python", *prog], args.torchrun_timeout))

    subreaper = harness.become_subreaper()
    print(f"bench_multinode: {platform.node()} {platform.release()}, {os.cpu_count()} CPUs, "
          f"subreaper={'on' if subreaper else 'off'}; 2 nodes on loopback, 1 worker each")
    print("  load average at start: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    tmp = tempfile.mkdtemp(prefix="bench_multinode-")
    res, errors = {}, []
    try:
        for lch in launchers:
            n = args.runs if lch.name == "launch" else args.torchrun_runs
            for key, fn in (("true", lambda: bench_true(lch, n, env, tmp)),
                            ("stop", lambda: bench_stop(lch, n, env, tmp, test_worker))):
                print(f"  running {lch.name} / {key} ...", flush=True)
                try:
                    res[(lch.name, key)] = fn()
                except RunFailed as e:
                    errors.append(f"{lch.name} / {key}: {e}")
                    print(f"    FAILED: {e}", flush=True)
    finally:
        harness.cleanup_leftovers(tmp, tries=50)
        shutil.rmtree(tmp, ignore_errors=True)

    def median(name, key, field):
        r = res.get((name, key))
        return statistics.median(r[field]) if r else None

    rows = []
    lw, tw = median("launch", "true", "walls"), median("torchrun", "true", "walls")
    ratio = tw / lw if lw and tw else None
    rows.append(["1. 2-node rendezvous + /bin/true, wall (median)",
                 fmt_s(lw) if lw else "FAILED", fmt_s(tw) if tw else ("skipped" if args.skip_torchrun else "FAILED"),
                 f"{ratio:.1f}x" if ratio else "not measured", f"ratio >= {WALL_RATIO_TARGET:.0f}x",
                 ("met" if ratio >= WALL_RATIO_TARGET else "MISSED") if ratio else "not measured"])
    rows.append(["   the same, launch's own target", fmt_s(lw) if lw else "FAILED", "-", "-",
                 f"launch <= {WALL_TARGET_S * 1000:.0f} ms",
                 ("met" if lw <= WALL_TARGET_S else "MISSED") if lw else "FAILED"])
    ls, ts = median("launch", "stop", "lat"), median("torchrun", "stop", "lat")
    rows.append(["2. failure on node A -> SIGTERM on node B (median)",
                 fmt_s(ls) if ls else "FAILED", fmt_s(ts) if ts else ("skipped" if args.skip_torchrun else "FAILED"),
                 f"{ts / ls:.1f}x" if ls and ts else "not measured", f"launch <= {STOP_TARGET_S * 1000:.0f} ms",
                 ("met" if ls <= STOP_TARGET_S else "MISSED") if ls else "FAILED"])
    head = ["metric", "launch", "torchrun", "torchrun/launch", "target", "result"]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print("  load average at end:   %.2f %.2f %.2f" % os.getloadavg())
    print()
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    for (name, key), r in sorted(res.items()):
        vals = r["walls"] if key == "true" else r["lat"]
        print(f"{name}/{key}: min {fmt_s(min(vals))}, max {fmt_s(max(vals))}, runs {len(vals)}; "
              f"command per node: {' '.join(r['argv'])}")
    if errors:
        print(f"\n{len(errors)} scenario(s) could not be measured:")
        for e in errors:
            print("  - " + e.splitlines()[0])
        return 1
    return 0


if __name__ == "__main__":
    harness.run_main(main, "bench_multinode")
