# What a script sees of its interpreter, as one JSON line per rank, so that a warm start
# (--warm-start) can be compared with a cold one. Run as a script or with -m warm_probe.
# argv[1]: "" (print and exit 0), "raise" or "exit" (rank 1 fails so), "exit-big" (rank 1 exits 7
# with 512 MiB to free), "fail-first DIR" (rank 1
# exits 3 in attempt 0, once rank 0 has printed), "wait FILE" (wait until FILE exists), "exit-message"
# (rank 1 exits with a message), "unclosed DIR" (each rank leaves DIR/unclosed.RANK open with a line
# buffered, and a thread that prints last), "touchy" (an object that warns when asked for any
# attribute, as torch's deprecated reduce_op, lives until the exit).
import sys

_PRELOADED = "xml.dom.minidom" in sys.modules  # before any import here: only a standby imported it
_CTYPES = "ctypes" in sys.modules  # loaded before the script ran (the standby holds its exit notice through it)

import atexit
import json
import os
import pickle
import signal
import stat
import threading
import time


class Point:  # pickled by reference to __main__, as multiprocessing and torch.save do
    def __init__(self, x):
        self.x = x


def fd_kind(fd):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return "closed"
    for name in ("S_ISSOCK", "S_ISFIFO", "S_ISCHR", "S_ISREG"):
        if getattr(stat, name)(mode):
            return name[4:]
    return "other"


main = sys.modules["__main__"]
info = {
    "argv": sys.argv,
    "path0": sys.path[0],
    "orig_argv": getattr(sys, "orig_argv", [None])[1:],
    "name": __name__,
    "file": __file__,
    "main_is_globals": main.__dict__ is globals(),
    "dunders": sorted(k for k in globals() if k.startswith("__")),
    "loader": type(__loader__).__name__,
    "spec": None if __spec__ is None else [__spec__.name, __spec__.origin],
    "package": __package__,
    "cached": globals().get("__cached__"),
    "doc": __doc__,
    "builtins_is_module": type(__builtins__).__name__,
    "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK",
                                            "TORCHELASTIC_RESTART_COUNT", "LAUNCH_PROGRESS_FD",
                                            "LAUNCH_STANDBY_FD", "LAUNCH_STANDBY_IMPORTS")},
    "env_keys": sorted(os.environ),
    "fds": {fd: fd_kind(fd) for fd in range(0, 8)},
    "stdin": os.path.basename(os.readlink("/proc/self/fd/0")) if os.readlink("/proc/self/fd/0") == "/dev/null" else "other",
    "threads": threading.active_count(),
    "signals": {n: str(signal.getsignal(getattr(signal, n))) for n in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGHUP")},
    "stdout": [sys.stdout.write_through, sys.stdout.line_buffering, sys.stdout.encoding],
    "flags": repr(sys.flags),
    "pickle": pickle.loads(pickle.dumps(Point(3))).x,
}
rank = int(os.environ.get("RANK", "0"))
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
print("PROBE %d %d %s %s" % (rank, restart, "warm" if _PRELOADED else "cold", json.dumps(info, sort_keys=True)))
# Whether launch's standby holds this worker's exit notice (LAUNCH_EXIT_NOTICE), and whether ctypes
# was loaded before the script.
print("NOTICE %d %d %d %d" % (rank, restart, getattr(sys.modules.get("_launch_standby"), "_NOTICE", None) is not None,
                              _CTYPES))
# The same for every fork of one interpreter, new for each interpreter (PYTHONHASHSEED=random).
print("INTERPRETER %d %d %d" % (rank, restart, hash("warm_probe")))

mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "raise" and rank == 1:
    def deeper():
        raise ValueError("rank 1 found a bad batch")
    deeper()
if mode == "exit" and rank == 1:
    sys.exit(7)
if mode == "exit-big" and rank == 1:  # 512 MiB in 4 KiB pages first: slow for the kernel to free
    import mmap
    big = mmap.mmap(-1, 512 << 20)
    big.madvise(mmap.MADV_NOHUGEPAGE)
    for at in range(0, len(big), 4096):
        big[at] = 1
    sys.exit(7)
if mode == "exit-message" and rank == 1:
    sys.exit("rank 1 gives up")
if mode == "unclosed":
    atexit.register(print, "ATEXIT %d %d" % (rank, restart))
    unclosed = open(os.path.join(sys.argv[2], "unclosed.%d" % rank), "w")
    unclosed.write("written by rank %d\n" % rank)
    threading.Thread(target=lambda: (time.sleep(0.2), print("THREAD %d" % rank))).start()
if mode == "touchy":
    class Touchy:  # as torch.distributed.reduce_op (torch 1.13): asking it for anything warns
        def __getattribute__(self, name):
            import warnings
            warnings.warn("a touchy object was asked for %s" % name)
            return object.__getattribute__(self, name)
    touchy = Touchy()
if mode == "fail-first":
    # Rank 1 fails once rank 0 has printed (else rank 0 could be stopped before it printed).
    printed = os.path.join(sys.argv[2], "printed.%d" % restart)
    if rank == 0:
        open(printed, "w").close()
    elif rank == 1 and restart == 0:
        deadline = time.monotonic() + 60
        while not os.path.exists(printed) and time.monotonic() < deadline:
            time.sleep(0.005)
        sys.exit(3)
if mode == "wait":
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
