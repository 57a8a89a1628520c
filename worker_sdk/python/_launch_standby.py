"""launch's standby interpreter (--warm-start).

The agent starts `python -u -c "import _launch_standby; _launch_standby.main()" SCRIPT ARGS` (or
`-m MODULE ARGS`) ahead of an attempt. It imports LAUNCH_STANDBY_IMPORTS (torch by default), says
"R" on its control socket (fd LAUNCH_STANDBY_FD), and waits. At the agent's go it takes the
worker's whole environment and its progress socket and stdin, and runs the script or module as
`python -u SCRIPT ARGS` would: the same sys.argv, sys.path[0], __main__, signals and exit codes.
Anything it cannot import it reports ("F<why>") and exits, and the agent starts that worker cold.

Protocol (agent -> standby, once): b"LGO1", a little-endian u32 N, then N bytes of NUL-separated
KEY=VALUE; the first byte carries two descriptors (SCM_RIGHTS): the progress socket, then stdin.
"""

import array
import builtins
import importlib
import os
import socket
import struct
import sys

_MAGIC = b"LGO1"
_PROGRESS_FD = 3  # LAUNCH_PROGRESS_FD, where a cold worker finds it too
_MAX_GO = 64 << 20


def _say(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        os._exit(0)  # the agent let this standby go


def _read_go(sock):
    head, fds = b"", []
    while len(head) < 8:
        data, anc, _, _ = sock.recvmsg(8 - len(head), socket.CMSG_SPACE(4 * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
                fds.extend(a)
        if not data:
            os._exit(0)  # closed without a go: this standby is not needed
        head += data
    (size,) = struct.unpack("<I", head[4:8])
    if head[:4] != _MAGIC or size > _MAX_GO or len(fds) != 2:
        sys.stderr.write("launch standby: a malformed go from the agent\n")
        os._exit(70)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(size - len(body), 1 << 20))
        if not chunk:
            os._exit(0)
        body += chunk
    env = {}
    for entry in bytes(body).split(b"\0"):
        if entry:
            key, _, value = entry.partition(b"=")
            env[key] = value
    return env, fds


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


def main():
    args = sys.argv[1:]
    module = len(args) >= 2 and args[0] == "-m"
    sock = socket.socket(fileno=int(os.environ["LAUNCH_STANDBY_FD"]))
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

    for name in filter(None, os.environ.get("LAUNCH_STANDBY_IMPORTS", "").split(",")):
        try:
            importlib.import_module(name)
        except BaseException as e:  # SystemExit from a module counts too
            why = str(e).splitlines()[0] if str(e) else ""
            _say(sock, ("F" + "cannot import %s: %s%s\n" % (name, type(e).__name__, ": " + why if why else ""))
                 .encode("utf-8", "replace"))
            os._exit(1)
    _say(sock, b"R")

    env, (progress, stdin) = _read_go(sock)
    os.environb.clear()
    os.environb.update(env)
    sock.detach()  # fd 3 becomes the progress socket below
    os.dup2(progress, _PROGRESS_FD)
    os.dup2(stdin, 0)
    for fd in (progress, stdin):
        if fd not in (0, _PROGRESS_FD):
            os.close(fd)
    del env, sock, args, flags

    try:
        if module:
            _run_module(target)
        else:
            _run_script(target)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        # Printed as the interpreter prints it, without this module's frames; exit status 1.
        t, v, tb = sys.exc_info()
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        if v is not None:
            v.__traceback__ = tb  # what the interpreter's hook prints, not its tb argument
        sys.excepthook(t, v, tb)
        del t, v, tb
        sys.exit(1)
