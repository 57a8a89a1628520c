"""launch's standby interpreter (--warm-start).

The agent starts `python -u -c "import _launch_standby; _launch_standby.main()" SCRIPT ARGS` (or
`-m MODULE ARGS`) for a local rank. It imports LAUNCH_STANDBY_IMPORTS (torch by default), says "R"
on its control socket (fd LAUNCH_STANDBY_FD), and waits for a go. At each go it gets the worker's
whole environment and its descriptors, and a worker runs the script or module as `python -u
SCRIPT ARGS` would: the same sys.argv, sys.path[0], __main__, signals and exit codes.

The worker is a fork of the standby when the agent allows it (LAUNCH_STANDBY_FORK=1: the agent
adopts orphans) and the standby has one thread: then the standby stays and serves the next go, so
a rank imports once per job. Through a middle process that exits at once, the fork becomes the
agent's child, as a worker started cold is. Otherwise the standby itself becomes the worker.
Anything it cannot import it reports ("F<why>") and exits, and the agent starts that worker cold.

Protocol (launch_sdk/contract.h declares it; tests/contract_check.py compares the values below
with it). Agent -> standby, per go: b"LGOV", the contract version (u32, little endian), the body's
length N (u32, little endian), then N bytes of NUL-separated KEY=VALUE; the first byte carries the
worker's descriptors (SCM_RIGHTS): its progress socket, stdin, stdout, stderr and, when there is
one, the orphan guard's pipe. Standby -> agent: "R" once ready; per go "P<pid>\\n", the worker's
pid (its own: it is the worker, and serves no more), and after a fork "D\\n" once the worker is
the agent's child. A go it cannot serve (of another contract version: launch and this module come
from different releases) it answers "F<why>\\n" and exits; the worker starts cold.
"""

import array
import atexit
import builtins
import gc
import importlib
import _io
import os
import socket
import struct
import sys

# launch_sdk/contract.h's, which tests/contract_check.py compares them with.
CONTRACT_VERSION = 2
_STANDBY_FD_ENV = "LAUNCH_STANDBY_FD"
_STANDBY_FORK_ENV = "LAUNCH_STANDBY_FORK"
_STANDBY_IMPORTS_ENV = "LAUNCH_STANDBY_IMPORTS"
_EXIT_NOTICE_ENV = "LAUNCH_EXIT_NOTICE"
_PROGRESS_FD_ENV = "LAUNCH_PROGRESS_FD"
_PROGRESS_FD = 3  # where a cold worker finds its progress socket too
_GO_MAGIC = b"LGOV"
_GO_MAGIC_V1 = b"LGO1"  # contract version 1's go, which carried no version
_GO_VERSION_BYTES = 8  # magic and version: the same in every version
_GO_HEADER_BYTES = 12  # then the body's length
_MAX_GO = 64 << 20
_MIN_FDS = 4
_MAX_FDS = 5
_READY, _FAILED, _PID, _FORKED = b"R", b"F", b"P", b"D"
_MAX_REPLAY = 1 << 20  # of what the imports printed, replayed into each worker's stdout and stderr
_PR_SET_PDEATHSIG = 1


def _say(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        os._exit(0)  # the agent let this standby go


def _refuse(sock, why):
    """A go this standby cannot serve: tells the agent why (the worker starts cold) and ends."""
    sys.stderr.write(why + "\n")
    try:
        sock.sendall(_FAILED + why.encode("utf-8", "replace") + b"\n")
    except OSError:
        pass
    os._exit(70)


def _go_version(head):
    """The contract version of the launch that sent a go beginning with `head`; 0: not a go."""
    if head[:4] == _GO_MAGIC_V1:
        return 1
    if head[:4] != _GO_MAGIC:
        return 0
    return struct.unpack("<I", head[4:8])[0]


def _recv_all(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1 << 20))
        if not chunk:
            os._exit(0)  # the agent let this standby go
        data += chunk
    return bytes(data)


def _read_go(sock):
    head, fds = b"", []
    while len(head) < _GO_VERSION_BYTES:
        data, anc, _, _ = sock.recvmsg(_GO_VERSION_BYTES - len(head), socket.CMSG_SPACE(_MAX_FDS * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
                fds.extend(a)
        if not data:
            os._exit(0)  # closed without a go: this standby is not needed
        head += data
    version = _go_version(head)
    if version == 0:
        _refuse(sock, "launch standby: the go is malformed (no go magic)")
    if version != CONTRACT_VERSION:
        _refuse(sock, "launch standby: launch speaks worker contract version %d, this standby's Python module "
                "(_launch_standby) version %d: install launch and launch-sdk (or launch's Python modules) of one "
                "release" % (version, CONTRACT_VERSION))
    head += _recv_all(sock, _GO_HEADER_BYTES - _GO_VERSION_BYTES)
    (size,) = struct.unpack("<I", head[_GO_VERSION_BYTES:_GO_HEADER_BYTES])
    if size > _MAX_GO or not _MIN_FDS <= len(fds) <= _MAX_FDS:
        _refuse(sock, "launch standby: the go is malformed (a body of %d bytes, %d descriptors)" % (size, len(fds)))
    body = _recv_all(sock, size)
    env = {}
    for entry in body.split(b"\0"):
        if entry:
            key, _, value = entry.partition(b"=")
            env[key] = value
    return env, fds


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # unknown: never fork


def _settle():
    """True when this process has one thread, after one fork whose child exits at once: thread
    pools that stop at a fork and start again when used (OpenBLAS's) stop now."""
    if _threads() == 1:
        return True
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3.12+: "multi-threaded, use of fork() may lead to deadlocks"
        try:
            pid = os.fork()
        except OSError:
            return False
        if pid == 0:
            os._exit(0)
    os.waitpid(pid, 0)
    return _threads() == 1


_WORKER, _SERVED, _NOT_FORKED = "worker", "served", "not forked"  # what _fork returns, and where


def _fork(sock, guard, agent):
    """In the standby: forks the worker through a middle process that gives it a process group of
    its own, registers that with the orphan guard (`guard`, when a descriptor), tells the agent the
    worker's pid and exits, so that the worker becomes the agent's child as a cold worker is.
    Returns _WORKER in the worker once it is the agent's (see _adopted), _SERVED in the standby
    once the middle process exited having made it, _NOT_FORKED when none was made."""
    r, w = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return _NOT_FORKED
    if middle == 0:
        try:
            middle = os.getpid()
            worker = os.fork()
            if worker == 0:
                os.close(w)
                _adopted(r, agent, middle)
                return _WORKER
            os.setpgid(worker, 0)  # here, so that the agent never signals a group not yet made
            if guard >= 0:
                os.write(guard, b"+%d\n" % worker)
            sock.sendall(_PID + b"%d\n" % worker)
            os.write(w, b"1")
        except BaseException:
            os._exit(1)  # a worker, if made, reads EOF and exits
        os._exit(0)
    os.close(r)
    os.close(w)
    try:
        _, status = os.waitpid(middle, 0)
    except ChildProcessError:
        status = 1
    return _SERVED if status == 0 else _NOT_FORKED


def _adopted(ready, agent, middle):
    """In a forked worker: waits until the agent has its pid and is its parent, then dies with it."""
    ok = os.read(ready, 1) == b"1"
    os.close(ready)
    if not ok:
        os._exit(1)
    while os.getppid() == middle:  # the middle process is exiting: a matter of microseconds
        os.sched_yield()
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL, as a cold worker
    if os.getppid() != agent:
        os._exit(1)  # the agent is gone


def _captured(fd):
    """What the standby wrote to `fd` (its stdout or stderr, files the agent made) before the go."""
    try:
        return os.pread(fd, _MAX_REPLAY, 0)
    except OSError:
        return b""


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def _exit_code(e):
    """The exit status the interpreter makes of SystemExit `e` (printing a non-integer code)."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write("%s\n" % (code,))
    except Exception:
        pass
    return 1


def _exit_fast(status):
    """A forked worker's exit: what the interpreter's exit does that a program sees (other threads
    joined, atexit handlers run, files left open flushed), without tearing down the modules and
    libraries it shares with the standby. That teardown writes to pages shared with the standby,
    each then copied: with torch about 1 s here, against 0.3 s in a worker started cold.
    multiprocessing's forked children end with os._exit after the same steps."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    # As the interpreter flushes a buffered file it frees at its exit. Only files are touched:
    # type() and a subclass test against the C base class run none of the script's code, where
    # isinstance() asks an object for its __class__ (a deprecated torch.distributed.reduce_op then
    # warns, and under PYTHONWARNINGS=error raises).
    for obj in gc.get_objects():
        if issubclass(type(obj), _io._IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except BaseException:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(status)


def _main_dict(**extra):
    d = sys.modules["__main__"].__dict__
    d.clear()
    d.update(__name__="__main__", __doc__=None, __package__=None, __loader__=None, __spec__=None,
             __annotations__={}, __builtins__=builtins)
    d.update(extra)
    return d


def _run_script(path):
    from importlib.machinery import SourceFileLoader

    full = os.path.abspath(path)
    try:
        with open(full, "rb") as f:  # read when it runs, as by the interpreter, not when the standby started
            source = f.read()
    except OSError as e:
        prog = sys.orig_argv[0] if hasattr(sys, "orig_argv") else "python"
        sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (prog, full, e.errno, e.strerror))
        sys.exit(2)
    code = compile(source, full, "exec", dont_inherit=True)
    d = _main_dict(__loader__=SourceFileLoader("__main__", full), __file__=full, __cached__=None)
    del source
    exec(code, d)


def _run_module(name):
    import runpy

    _main_dict()
    # What `python -m` itself calls: sys.argv[0] becomes the module's file.
    runpy._run_module_as_main(name, alter_argv=True)


# launch_sdk/contract.h's exit-notice slot: seq (u32), pid, tid (i32 each), 4 bytes, then the mutex.
_SLOT_BYTES, _SEQ_OFFSET, _PID_OFFSET, _TID_OFFSET, _MUTEX_OFFSET = 64, 0, 4, 8, 16
_MAX_LOCAL_RANKS = 4096
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
_NOTICE = None  # the file's mapping, once held


def _follow_thread_settings():
    """A script that sets OMP_NUM_THREADS (or MKL_NUM_THREADS) in os.environ before `import torch`
    gets that many threads when started cold: torch reads them as it loads. Here torch was loaded by
    the standby, so the value is applied when the script sets it, as the cold import would have
    (MKL_NUM_THREADS first where set, as torch reads them)."""
    torch = sys.modules.get("torch")
    set_num_threads = getattr(torch, "set_num_threads", None) if torch is not None else None
    if set_num_threads is None:
        return
    environ_type = type(os.environ)
    setitem = environ_type.__setitem__

    def __setitem__(self, key, value):
        setitem(self, key, value)
        if self is not os.environ or key not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            return
        chosen = os.environ.get("MKL_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        try:
            n = int(chosen)
        except (TypeError, ValueError):
            return
        if n >= 1:
            set_num_threads(n)

    environ_type.__setitem__ = __setitem__


def _count_steps():
    """Optimizer steps as progress (launch_progress._count_optimizer_steps), where the standby
    imported torch and the worker has launch's progress socket."""
    torch = sys.modules.get("torch")
    if torch is None or not os.environ.get(_PROGRESS_FD_ENV):
        return
    try:
        import launch_progress

        launch_progress._count_optimizer_steps(torch)
    except Exception:
        pass  # steps the script reports itself still count


def _hold_exit_notice():
    """Holds this rank's exit notice for launch (LAUNCH_EXIT_NOTICE), as worker_sdk's Context::Init
    does: a robust, process-shared mutex in launch's file that the kernel hands over when this
    thread exits, before it frees the worker's memory, so that launch stops the group sooner on a
    failure. Held by the main thread, which runs the script. Without the variable: nothing."""
    global _NOTICE
    path, local = os.environ.get(_EXIT_NOTICE_ENV), os.environ.get("LOCAL_RANK")
    if not path or not local or _NOTICE is not None:
        return
    # Through ctypes only where the standby's imports loaded it (torch does): imported here, it
    # would leave the script a descriptor (libffi's) and a module that a cold start does not have.
    ctypes = sys.modules.get("ctypes")
    if ctypes is None:
        return
    try:
        import _thread
        import errno

        rank = int(local)
        if not 0 <= rank < _MAX_LOCAL_RANKS:
            raise ValueError("LOCAL_RANK '%s' is not a local rank" % local)
        end = (rank + 1) * _SLOT_BYTES
        libc = ctypes.CDLL(None, use_errno=True)
        # libc's mmap, not Python's: an mmap object keeps a descriptor of the file open, which the
        # script would see.
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < end:
                raise ValueError("%s holds %d bytes: no slot for local rank %d" % (path, size, rank))
            addr = libc.mmap(None, end, 3, 1, fd, 0)  # PROT_READ | PROT_WRITE, MAP_SHARED
        finally:
            os.close(fd)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "cannot map %s: %s" % (path, os.strerror(ctypes.get_errno())))
        mm = (ctypes.c_char * end).from_address(addr)
        at = rank * _SLOT_BYTES
        mutex = ctypes.c_void_p(addr + at + _MUTEX_OFFSET)
        # A slot held by a live process is left to it; a new one's zeros or a predecessor's mutex
        # are taken (as exit_notice.cc does).
        held = libc.pthread_mutex_trylock(mutex)
        if held == errno.EBUSY:
            raise OSError(held, "local rank %d's slot in %s is held by process %d"
                          % (rank, path, struct.unpack_from("i", mm, at + _PID_OFFSET)[0]))
        if held == errno.EOWNERDEAD:
            libc.pthread_mutex_consistent(mutex)
        if held in (0, errno.EOWNERDEAD):
            libc.pthread_mutex_unlock(mutex)
        attr = ctypes.create_string_buffer(64)  # pthread_mutexattr_t: 4 bytes in glibc, 8 on some ports
        libc.pthread_mutexattr_init(attr)
        libc.pthread_mutexattr_setpshared(attr, 1)  # PTHREAD_PROCESS_SHARED
        libc.pthread_mutexattr_setrobust(attr, 1)  # PTHREAD_MUTEX_ROBUST
        rc = libc.pthread_mutex_init(mutex, attr) or libc.pthread_mutex_lock(mutex)
        tid = _thread.get_native_id()
        if rc != 0 or struct.unpack_from("I", mm, at + _MUTEX_OFFSET)[0] & 0x3FFFFFFF != tid:
            raise OSError(rc, "cannot hold its mutex" if rc else "this C library's mutex is not the kernel's robust futex")
        struct.pack_into("i", mm, at + _TID_OFFSET, tid)  # tid before pid, as exit_notice.cc
        struct.pack_into("i", mm, at + _PID_OFFSET, os.getpid())
        seq = (struct.unpack_from("I", mm, at + _SEQ_OFFSET)[0] + 1) & 0xFFFFFFFF
        struct.pack_into("I", mm, at + _SEQ_OFFSET, seq)
        sys_futex = _SYS_FUTEX.get(os.uname().machine)
        if sys_futex is not None:  # FUTEX_WAKE, shared: launch maps the file too
            libc.syscall(ctypes.c_long(sys_futex), ctypes.c_void_p(addr + at + _SEQ_OFFSET), 1, 0x7FFFFFFF, None, None, 0)
        _NOTICE = mm  # mapped for the life of the process
    except Exception as e:  # the worker runs on; launch sees its exit when it is reaped
        print("launch: launch will see this worker's exit only once it is reaped: %s" % e, file=sys.stderr)


def main():
    args = sys.argv[1:]
    module = len(args) >= 2 and args[0] == "-m"
    sock = socket.socket(fileno=int(os.environ[_STANDBY_FD_ENV]))
    may_fork = os.environ.get(_STANDBY_FORK_ENV) == "1"
    agent = os.getppid()
    # As `python -u [-m] TARGET ARGS` sets them, before anything is imported.
    flags = sys.orig_argv[: sys.orig_argv.index("-c")] if hasattr(sys, "orig_argv") else []
    if module:
        target = args[1]
        sys.argv = ["-m"] + args[2:]
        sys.path[0] = os.getcwd()
    else:
        target = args[0]
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.realpath(target))
    if flags:
        sys.orig_argv = flags + args

    for name in filter(None, os.environ.get(_STANDBY_IMPORTS_ENV, "").split(",")):
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit from a module counts too
            why = str(e).splitlines()[0] if str(e) else ""
            _say(sock, _FAILED + ("cannot import %s: %s%s\n" % (name, type(e).__name__, ": " + why if why else ""))
                 .encode("utf-8", "replace"))
            os._exit(1)
    may_fork = may_fork and _settle()
    _say(sock, _READY)

    while True:
        env, fds = _read_go(sock)
        guard = fds[4] if len(fds) > 4 else -1
        how = _fork(sock, guard, agent) if may_fork and _threads() == 1 else _NOT_FORKED
        if how == _SERVED:  # a worker of its own now: this standby serves the next go
            for fd in fds:
                os.close(fd)
            _say(sock, _FORKED + b"\n")
            continue
        if how == _NOT_FORKED:
            _say(sock, _PID + b"%d\n" % os.getpid())  # the standby itself becomes the worker
        break
    forked = how == _WORKER

    progress, stdin, out, err = fds[:4]
    if forked:
        sock.close()
        try:  # each cold worker seeds numpy afresh; Python's random reseeds at fork
            sys.modules["numpy"].random.seed()
        except Exception:
            pass  # numpy not imported (or without its global generator)
    else:
        sock.detach()  # fd 3 becomes the progress socket below
    if guard >= 0:
        os.close(guard)
    sys.stdout.flush()
    sys.stderr.flush()
    replay = [(1, _captured(1)), (2, _captured(2))]
    os.environb.clear()
    os.environb.update(env)
    for fd, to in ((progress, _PROGRESS_FD), (stdin, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
    for fd in (progress, stdin, out, err):
        if fd not in (0, 1, 2, _PROGRESS_FD):
            os.close(fd)
    for fd, data in replay:
        _write_all(fd, data)
    del env, sock, args, flags, fds, replay
    _hold_exit_notice()
    _follow_thread_settings()
    _count_steps()

    try:
        if module:
            _run_module(target)
        else:
            _run_script(target)
    except SystemExit as e:
        if not forked:
            raise
        code = _exit_code(e)
        del e
        _exit_fast(code)
    except KeyboardInterrupt:
        raise  # the interpreter's exit: killed by SIGINT, as a cold worker
    except BaseException:
        # Printed as the interpreter prints it, without this module's frames; exit status 1.
        t, v, tb = sys.exc_info()
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        if v is not None:
            v.__traceback__ = tb  # what the interpreter's hook prints, not its tb argument
        sys.excepthook(t, v, tb)
        del t, v, tb
        if forked:
            _exit_fast(1)
        sys.exit(1)
    if forked:
        _exit_fast(0)
