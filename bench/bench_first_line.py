#!/usr/bin/python3
"""Time to first output line: launch warm (its default), launch --warm-start=false (cold) and
torchrun (torch 1.13, through bench/torchrun_patched.py), one run, on a quiet or a busy machine.

The job is a 2-rank Python DDP script the bench writes into a temporary directory: import torch,
init_process_group("gloo"), a small DDP model, one line "rank R ready" (flushed), a few steps,
exit 0. For each launcher: from its spawn to the first line containing "ready" on its stdout
(read from a pipe as it comes, time.monotonic()), and the wall time from spawn to reap.
Median, min and max of --runs runs, after one uncounted warm-up run of each; the runs of the
three launchers are interleaved, the order rotating from one repetition to the next.

  target: launch warm <= torchrun (time to the first line, medians)

--busy N starts N CPU-burning processes (`sh -c 'while :; do :; done'`) before the warm-up runs
and kills them at the end, whatever happens; the machine has 2 cores, so --busy 4 leaves each
launcher a third of a core or less.

Usage:
    /usr/bin/python3 bench/bench_first_line.py [--runs 5] [--busy N] [--skip-torchrun]

Exit status: 0 when every run succeeded (a target NOT met still exits 0); 1 when a run failed (a
non-zero exit of a job, a timeout, no "ready" line, processes left behind) or the bench could
not run (bad arguments, missing binary).
"""
import argparse
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
import harness  # noqa: E402

# Variables a parent launcher may have set; the launchers under test must not inherit them.
_SCRUB_PREFIXES = ("TORCHELASTIC_",)
_SCRUB_NAMES = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
}

WORKER = '''\
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(128, 128))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sys.stdout.write(f"rank {rank} ready\\n")  # one write: ranks sharing a pipe (torchrun) do not split it
sys.stdout.flush()
x = torch.randn(32, 128)
for _ in range(5):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
sys.stdout.write(f"rank {rank} done\\n")
sys.stdout.flush()
dist.destroy_process_group()
sys.exit(0)
'''


class Run:
    def __init__(self, first_s, all_s, wall_s, warm):
        self.first_s = first_s  # spawn -> first "ready" line
        self.all_s = all_s      # spawn -> every rank's "ready" line
        self.wall_s = wall_s    # spawn -> reap
        self.warm = warm        # launch's "K of M worker(s) started warm" K, or None


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cleanup_leftovers(exclude, marker, tries=50):
    """harness.cleanup_leftovers, but sparing the burners (our own children too)."""
    me = os.getpid()
    found = {}
    for _ in range(tries):
        harness.reap_zombies()
        stray = []
        for p in harness.all_pids():
            if p == me or p in exclude:
                continue
            st = harness.read_stat(p)
            if not st or st[1] in ("Z", "X"):
                continue
            if st[0] == me or harness.cmdline_has(p, marker):
                stray.append(p)
        if not stray:
            break
        for p in stray:
            found.setdefault(p, harness.cmdline(p))
            harness.kill(p, signal.SIGKILL)
        time.sleep(0.02)
    harness.reap_zombies()
    return sorted(found.items())


def kill_tree(pid, exclude, marker):
    tree = harness.descendants(pid)
    harness.kill(pid, signal.SIGKILL)
    for p in tree:
        harness.kill(p, signal.SIGKILL)
    harness.wait_exit(pid, 5.0)
    cleanup_leftovers(exclude, marker)


def run_job(argv, env, timeout, err_path, nranks, exclude, marker):
    """Run argv (own session, stdin /dev/null, stdout to a pipe read as it comes, stderr to
    err_path) to its end; return Run. Raises harness.RunFailed on a timeout, a non-zero exit,
    a missing "ready" line or processes left behind."""
    r, w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.monotonic()
        pid = os.posix_spawn(argv[0], argv, env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0),
                                           (os.POSIX_SPAWN_DUP2, w, 1),
                                           (os.POSIX_SPAWN_DUP2, err, 2),
                                           (os.POSIX_SPAWN_CLOSE, r)],
                             setsid=True)
    except OSError as e:
        os.close(r)
        raise harness.RunFailed(f"cannot start {argv[0]}: {e}")
    finally:
        os.close(w)
        os.close(devnull)
        os.close(err)
    reaped = False
    out, readies = b"", []
    try:
        deadline = t0 + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise harness.RunFailed(f"timed out after {timeout:.0f} s: {' '.join(argv)}\n"
                                        f"  stderr tail:\n{harness.tail(err_path)}")
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 65536)
            now = time.monotonic()
            if not chunk:
                break  # EOF: every writer (launcher, workers) closed its stdout
            out += chunk
            # Each "ready" timed by the read that brought it (counted, not matched per line: the
            # ranks of torchrun write to one pipe, and a line of one may hold the other's).
            n = out.count(b"ready")
            readies += [now] * (n - len(readies))
        got = harness.wait_exit(pid, max(deadline - time.monotonic(), 0.1))
        if got is None:
            raise harness.RunFailed(f"stdout closed but the launcher did not exit: {' '.join(argv)}")
        status, _, _ = got
        t1 = time.monotonic()
        reaped = True
        code = os.waitstatus_to_exitcode(status)
        leaked = cleanup_leftovers(exclude, marker)
        text = out.decode("utf-8", "replace")
        if code != 0:
            raise harness.RunFailed(f"{' '.join(argv)} exited {code}\n  stdout tail:\n"
                                    + "\n".join("    | " + l for l in text.splitlines()[-10:])
                                    + f"\n  stderr tail:\n{harness.tail(err_path)}")
        if leaked:
            raise harness.RunFailed(f"left {len(leaked)} process(es) running (killed them): {leaked}")
        if len(readies) < nranks:
            raise harness.RunFailed(f"{len(readies)} 'ready' line(s) of {nranks} on stdout:\n"
                                    + "\n".join("    | " + l for l in text.splitlines()[-10:]))
        warm = None
        try:
            with open(err_path, errors="replace") as f:
                for line in f:
                    i = line.find(" worker(s) started warm")
                    if i > 0:
                        warm = int(line[:i].split(" of ")[0].split()[-1])
        except (OSError, ValueError, IndexError):
            pass
        return Run(readies[0] - t0, readies[nranks - 1] - t0, t1 - t0, warm)
    finally:
        os.close(r)
        if not reaped:
            kill_tree(pid, exclude, marker)


class Burners:
    """N CPU-burning processes (own sessions), killed in stop(), also on errors and Ctrl-C."""

    def __init__(self, n):
        self.pids = []
        for _ in range(n):
            self.pids.append(os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "while :; do :; done"],
                                            dict(PATH="/usr/bin:/bin"), setsid=True))

    def stop(self):
        for p in self.pids:
            harness.kill(p, signal.SIGKILL)
        for p in self.pids:
            try:
                os.waitpid(p, 0)
            except ChildProcessError:
                pass
        self.pids = []


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v[:8]) - idle, sum(v[:8])


def fmt(xs):
    return f"median {statistics.median(xs):6.3f} s (min {min(xs):.3f}, max {max(xs):.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", default=os.path.join(BENCH_DIR, "..", "build", "bin", "launch"))
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="interpreter with torch 1.13 (PYTHON_EXEC of launch's workers, and torchrun's)")
    ap.add_argument("--runs", type=int, default=5, help="measured runs per launcher (default 5), +1 warm-up")
    ap.add_argument("--busy", type=int, default=0,
                    help="CPU-burning processes running during the measurement (default 0: quiet)")
    ap.add_argument("--skip-torchrun", action="store_true")
    ap.add_argument("--torchrun-monitor-interval", type=float, default=0.1,
                    help="torchrun's --monitor_interval (default 0.1 s, as the other benches; at its own "
                         "default of 5 s its exit, not its first line, would wait for the poll)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per run (default 180)")
    ap.add_argument("--launch-log-level", default=None,
                    help="LAUNCH_LOG_LEVEL for the launch runs (e.g. debug; see --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (launchers' stderr)")
    args = ap.parse_args()
    if args.runs < 1 or args.busy < 0:
        raise harness.HarnessError("--runs must be >= 1 and --busy >= 0")
    args.launch = os.path.abspath(args.launch)
    if not (os.path.isfile(args.launch) and os.access(args.launch, os.X_OK)):
        raise harness.HarnessError(f"--launch {args.launch}: not an executable file (build first)")
    if not os.access(args.python, os.X_OK):
        raise harness.HarnessError(f"--python {args.python}: not executable")

    env = {k: v for k, v in os.environ.items() if k not in _SCRUB_NAMES and not k.startswith(_SCRUB_PREFIXES)}
    env.pop("PYTHONPATH", None)
    env["PYTHON_EXEC"] = args.python
    launch_env = dict(env)
    if args.launch_log_level:
        launch_env["LAUNCH_LOG_LEVEL"] = args.launch_log_level

    tmp = tempfile.mkdtemp(prefix="bench-first-line-")
    script = os.path.join(tmp, "first_line_ddp.py")
    with open(script, "w") as f:
        f.write(WORKER)
    wrapper = os.path.join(BENCH_DIR, "torchrun_patched.py")

    def argv_of(name):
        if name == "warm":
            return [args.launch, "--nproc-per-node=2", script]  # warm start is launch's default
        if name == "cold":
            return [args.launch, "--nproc-per-node=2", "--warm-start=false", script]
        # Static rendezvous on a free port (never a fixed one; --standalone's is 29400).
        return [args.python, wrapper, "--nproc_per_node=2", "--master_addr=127.0.0.1",
                f"--master_port={free_port()}", f"--monitor_interval={args.torchrun_monitor_interval}", script]

    names = ["warm", "cold"] + ([] if args.skip_torchrun else ["torchrun"])
    harness.become_subreaper()

    def on_term(*_):
        raise KeyboardInterrupt  # the finally below kills the burners and the job

    signal.signal(signal.SIGTERM, on_term)
    print(f"bench_first_line: {platform.node()}, {os.cpu_count()} CPUs, {args.runs} runs each (+1 warm-up), "
          f"{'quiet' if not args.busy else f'busy: {args.busy} CPU burners'}")
    print(f"  launch: {args.launch}   python: {args.python}")
    print("  load average before: %.2f %.2f %.2f" % os.getloadavg(), flush=True)

    runs = {n: [] for n in names}
    failed = {}
    burners = None
    try:
        burners = Burners(args.busy)
        busy0 = cpu_times()
        for rep in range(args.runs + 1):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                if name in failed:
                    continue
                try:
                    r = run_job(argv_of(name), launch_env if name != "torchrun" else env, args.timeout,
                                os.path.join(tmp, f"{name}-{rep}.err"), 2, set(burners.pids), script)
                except harness.RunFailed as e:
                    failed[name] = str(e)
                    print(f"  {name}: run {rep} FAILED: {e}", flush=True)
                    continue
                label = "warm-up" if rep == 0 else f"run {rep}"
                warm = "" if r.warm is None else f", {r.warm} of 2 started warm"
                print(f"  {label:7} {name:8}: first line {r.first_s:.3f} s, both ranks {r.all_s:.3f} s, "
                      f"wall {r.wall_s:.3f} s{warm}; load {os.getloadavg()[0]:.2f}", flush=True)
                if rep:
                    runs[name].append(r)
        busy1 = cpu_times()
    finally:
        if burners:
            burners.stop()
        cleanup_leftovers(set(), script)
        if args.keep:
            print(f"  kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    util = 100.0 * (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1)
    print("  load average after: %.2f %.2f %.2f; CPUs busy %.0f%% over the measurement" % (os.getloadavg() + (util,)))
    print()
    print(f"time to the first 'ready' line, {args.runs} runs, "
          f"{'quiet machine' if not args.busy else f'{args.busy} CPU burners on {os.cpu_count()} CPUs'}:")
    labels = {"warm": "launch warm (default)", "cold": "launch --warm-start=false", "torchrun": "torchrun 1.13"}
    for name in names:
        if name in failed:
            print(f"  {labels[name]:26} FAILED")
            continue
        xs = runs[name]
        print(f"  {labels[name]:26} first line {fmt([r.first_s for r in xs])}; "
              f"wall {fmt([r.wall_s for r in xs])}")
    med = {n: statistics.median(r.first_s for r in runs[n]) for n in names if n not in failed}
    wmed = {n: statistics.median(r.wall_s for r in runs[n]) for n in names if n not in failed}
    if "warm" in med and "cold" in med:
        print(f"  cold / warm:     first line {med['cold'] / med['warm']:.2f}x, wall {wmed['cold'] / wmed['warm']:.2f}x")
    if "warm" in med and "torchrun" in med:
        print(f"  torchrun / warm: first line {med['torchrun'] / med['warm']:.2f}x, wall {wmed['torchrun'] / wmed['warm']:.2f}x")
        print(f"  target: launch warm <= torchrun (first line, medians): "
              f"{'met' if med['warm'] <= med['torchrun'] else 'NOT met'}")
    else:
        print("  target: launch warm <= torchrun: not measured")
    return 1 if failed else 0


if __name__ == "__main__":
    harness.run_main(main, "bench_first_line.py")
