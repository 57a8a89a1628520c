"""Process handling shared by bench_launch.py and bench_ddp.py (standard library only, Linux).

Every run has a timeout; nothing it starts outlives it: the harness makes itself a child
subreaper, so processes a launcher leaves behind are re-parented to it, found, killed and
reported.

The two benchmarks word their errors differently and raise different exception classes, so
run_once takes the exceptions to raise from the caller (on_timeout / on_leak); the defaults are
bench_ddp.py's HarnessError messages.
"""
import ctypes
import os
import select
import signal
import sys
import time


class HarnessError(Exception):
    """The benchmark could not run or measure something (bad arguments, missing binary...)."""


class RunFailed(Exception):
    """A launcher run misbehaved: timeout, signal, unexpected exit code, missing stamps.
    (Used by bench_launch.py, which records it per scenario and goes on.)"""


class Result:
    def __init__(self, code, wall_s, maxrss_kib, exit_ns=0):
        self.code = code          # exit code (>= 0) or -signal
        self.wall_s = wall_s
        self.maxrss_kib = maxrss_kib
        self.exit_ns = exit_ns    # CLOCK_REALTIME when the launcher was reaped (workers' stamps use it)


def become_subreaper():
    """Make orphaned descendants (workers a launcher left behind) re-parent to us, so they can
    be detected and killed instead of leaking. Linux only; best effort."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def read_stat(pid):
    """(ppid, state) of pid from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()
    return int(rest[1]), rest[0]


def all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def descendants(root):
    """Live descendants of root (pids), found through /proc ppid links."""
    children = {}
    for pid in all_pids():
        st = read_stat(pid)
        if st:
            children.setdefault(st[0], []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cmdline_has(pid, needle):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def kill(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_zombies():
    """Reap any zombie children (orphans re-parented to us as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_exit(pid, timeout, poll_s=0.0005):
    """Wait for child pid to exit, at most timeout seconds. Returns (status, rusage, t_exit) or
    None on timeout. Uses a pidfd so the wake-up is immediate (no polling granularity); without
    pidfd_open it polls every poll_s seconds."""
    deadline = time.perf_counter() + timeout
    pidfd = -1
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1
    try:
        while True:
            wpid, status, ru = os.wait4(pid, os.WNOHANG)
            if wpid == pid:
                return status, ru, time.perf_counter()
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            if pidfd >= 0:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, poll_s))
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def spawn(argv, env, log_path):
    """Start argv in its own session with stdin=/dev/null and stdout+stderr to log_path.
    Returns (pid, t0)."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, env,
                             file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0),
                                           (os.POSIX_SPAWN_DUP2, log, 1),
                                           (os.POSIX_SPAWN_DUP2, log, 2)],
                             setsid=True)
    finally:
        os.close(devnull)
        os.close(log)
    return pid, t0


def tail(path, n=25, missing="    | <no output>"):
    """The last n lines of the file at path, each prefixed with '    | '; missing when it
    cannot be read."""
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return missing
    return "\n".join("    | " + l for l in lines[-n:]) or "    | <empty>"


def cleanup_leftovers(marker=None, tries=50):
    """Kill processes left behind by the last run (descendants re-parented to us, or, when
    marker is given, processes whose argv holds marker); return (pid, cmdline) for each one
    found. Rescans up to tries times, 20 ms apart (SIGKILLed processes take a moment to turn
    into zombies)."""
    me = os.getpid()
    found = {}
    for _ in range(tries):
        reap_zombies()
        stray = []
        for p in all_pids():
            st = read_stat(p) if p != me else None
            if not st or st[1] in ("Z", "X"):
                continue
            if st[0] == me or (marker and cmdline_has(p, marker)):
                stray.append(p)
        if not stray:
            break
        for p in stray:
            found.setdefault(p, cmdline(p))
            kill(p, signal.SIGKILL)
        time.sleep(0.02)
    reap_zombies()
    return sorted(found.items())


def timeout_error(argv, timeout, log_path):
    return HarnessError(f"timed out after {timeout:.0f} s (killed): {' '.join(argv)}\n"
                        f"  output tail:\n{tail(log_path)}")


def leak_error(argv, leaked):
    return HarnessError(f"left {len(leaked)} process(es) running (killed them): {leaked}\n"
                        f"  command: {' '.join(argv)}")


def run_once(argv, env, timeout, log_path, leak_marker=None, stop_grace=5.0, poll_s=0.0005,
             leftover_tries=50, on_timeout=timeout_error, on_leak=leak_error):
    """Run argv (own session; stdin /dev/null; stdout+stderr to log_path) to completion and
    return Result (exit code, wall seconds from spawn to reap, ru_maxrss in KiB from wait4).

    On timeout: SIGTERM the launcher (its own job is to stop its workers), then after
    stop_grace SIGKILL it and every descendant, and raise on_timeout(argv, timeout, log_path).
    After the launcher exits, any process it left behind (a descendant re-parented to us, or a
    process whose argv holds leak_marker) is killed and on_leak(argv, [(pid, cmdline)...]) is
    raised. poll_s and leftover_tries are passed to wait_exit and cleanup_leftovers."""
    pid, t0 = spawn(argv, env, log_path)
    reaped = False
    try:
        got = wait_exit(pid, timeout, poll_s)
        if got is None:
            tree = descendants(pid)
            kill(pid, signal.SIGTERM)
            got = wait_exit(pid, stop_grace, poll_s)
            tree += [p for p in descendants(pid) if p not in tree]
            if got is None:
                kill(pid, signal.SIGKILL)
                for p in tree:
                    kill(p, signal.SIGKILL)
                wait_exit(pid, stop_grace, poll_s)
            reaped = True
            for p in tree:
                kill(p, signal.SIGKILL)
            cleanup_leftovers(leak_marker, leftover_tries)
            raise on_timeout(argv, timeout, log_path)
        status, ru, t1 = got
        exit_ns = time.time_ns() - int((time.perf_counter() - t1) * 1e9)
        reaped = True
        code = os.waitstatus_to_exitcode(status)
        leaked = cleanup_leftovers(leak_marker, leftover_tries)
        if leaked:
            raise on_leak(argv, leaked)
        return Result(code, t1 - t0, ru.ru_maxrss, exit_ns)
    finally:
        if not reaped:  # an exception escaped (e.g. KeyboardInterrupt): never leave it behind
            tree = descendants(pid)
            kill(pid, signal.SIGKILL)
            for p in tree:
                kill(p, signal.SIGKILL)
            wait_exit(pid, stop_grace, poll_s)
            cleanup_leftovers(leak_marker, leftover_tries)


def run_main(main, name, interrupted_code=130):
    """sys.exit(main()), with a HarnessError as one line `NAME: error: ...` and exit 1, and
    Ctrl-C as `NAME: interrupted` and interrupted_code."""
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(interrupted_code)
