"""Checks launch's Python modules against the C++ contract (launch_sdk/contract.h).

    contract_check.py CONTRACT_DUMP PYTHON_DIR

CONTRACT_DUMP (tests/contract_dump.cc) prints the contract as JSON; PYTHON_DIR holds
_launch_standby.py and launch_progress.py. Every value the modules spell (the LAUNCH_* names, the
progress descriptor, the go message's layout and answers, the exit-notice slot, the progress
datagrams, the contract version) must be the contract's, every LAUNCH_* name in their source must be
one the contract declares, and the standby must read a go as the agent encodes it and refuse one of
another version. Prints one line per difference and exits 1 on any.
"""

import ast
import json
import os
import re
import socket
import struct
import subprocess
import sys


def main():
    dump, python_dir = sys.argv[1], sys.argv[2]
    c = json.loads(subprocess.run([dump], check=True, capture_output=True, text=True).stdout)
    sys.path.insert(0, python_dir)
    import _launch_standby as s
    import launch_progress as p

    env, go, slot, prog = c["env"], c["go"], c["exit_notice"], c["progress"]
    pairs = [
        ("_launch_standby.CONTRACT_VERSION", s.CONTRACT_VERSION, c["version"]),
        ("_launch_standby._STANDBY_FD_ENV", s._STANDBY_FD_ENV, env["kStandbyFdEnv"]),
        ("_launch_standby._STANDBY_FORK_ENV", s._STANDBY_FORK_ENV, env["kStandbyForkEnv"]),
        ("_launch_standby._STANDBY_IMPORTS_ENV", s._STANDBY_IMPORTS_ENV, env["kStandbyImportsEnv"]),
        ("_launch_standby._EXIT_NOTICE_ENV", s._EXIT_NOTICE_ENV, env["kExitNoticeEnv"]),
        ("_launch_standby._PROGRESS_FD", s._PROGRESS_FD, c["fds"]["kProgressFd"]),
        ("_launch_standby._GO_MAGIC", s._GO_MAGIC, go["kGoMagic"].encode()),
        ("_launch_standby._GO_MAGIC_V1", s._GO_MAGIC_V1, go["kGoMagicV1"].encode()),
        ("_launch_standby._GO_VERSION_BYTES", s._GO_VERSION_BYTES, go["kGoVersionBytes"]),
        ("_launch_standby._GO_HEADER_BYTES", s._GO_HEADER_BYTES, go["kGoHeaderBytes"]),
        ("_launch_standby._MAX_GO", s._MAX_GO, go["kMaxGoBody"]),
        ("_launch_standby._MIN_FDS", s._MIN_FDS, go["kGoMinFds"]),
        ("_launch_standby._MAX_FDS", s._MAX_FDS, go["kGoMaxFds"]),
        ("_launch_standby._READY", s._READY, go["kStandbyReady"].encode()),
        ("_launch_standby._FAILED", s._FAILED, go["kStandbyFailed"].encode()),
        ("_launch_standby._PID", s._PID, go["kStandbyPid"].encode()),
        ("_launch_standby._FORKED", s._FORKED, go["kStandbyForked"].encode()),
        ("_launch_standby._SLOT_BYTES", s._SLOT_BYTES, slot["kExitNoticeSlotBytes"]),
        ("_launch_standby._SEQ_OFFSET", s._SEQ_OFFSET, slot["kExitNoticeSeqOffset"]),
        ("_launch_standby._PID_OFFSET", s._PID_OFFSET, slot["kExitNoticePidOffset"]),
        ("_launch_standby._TID_OFFSET", s._TID_OFFSET, slot["kExitNoticeTidOffset"]),
        ("_launch_standby._MUTEX_OFFSET", s._MUTEX_OFFSET, slot["kExitNoticeMutexOffset"]),
        ("_launch_standby._MAX_LOCAL_RANKS", s._MAX_LOCAL_RANKS, slot["kMaxLocalRanks"]),
        ("launch_progress._PROGRESS_FD_ENV", p._PROGRESS_FD_ENV, env["kProgressFdEnv"]),
        ("launch_progress._STACK_FILE_ENV", p._STACK_FILE_ENV, env["kStackFileEnv"]),
        ("launch_progress._PROGRESS.size", p._PROGRESS.size, prog["ProgressRecord.bytes"]),
        ("launch_progress._PROGRESS_MAGIC", p._PROGRESS_MAGIC, prog["ProgressRecord.magic"]),
        ("launch_progress._COUNTED_MAGIC", p._COUNTED_MAGIC, prog["kCountedProgressMagic"]),
        ("launch_progress._COUNT_STACKS_ENV", p._COUNT_STACKS_ENV, env["kCountedStacksEnv"]),
        ("_launch_standby._PROGRESS_FD_ENV", s._PROGRESS_FD_ENV, env["kProgressFdEnv"]),
        ("launch_progress._STACKS.size", p._STACKS.size, prog["StackDumpRecord.bytes"]),
        ("launch_progress._STACKS_MAGIC", p._STACKS_MAGIC, prog["StackDumpRecord.magic"]),
    ]
    wrong = ["%s: Python has %r, the C++ contract %r" % (name, py, cpp) for name, py, cpp in pairs if py != cpp]

    # A name spelled in a module but not declared by the contract is a name only one side knows.
    declared = set(env.values())
    for module in (s, p):
        with open(module.__file__) as f:
            for name in sorted(set(re.findall(r"LAUNCH_[A-Z0-9_]+", f.read()))):
                if name not in declared:
                    wrong.append("%s spells %s, which launch_sdk/contract.h does not declare"
                                 % (os.path.basename(module.__file__), name))

    # The standby reads the go the agent encodes, and refuses one of another version (or version 1's).
    example = bytes.fromhex(go["example_hex"])
    got = _read(s, example)
    if got != ("go", {b"A": b"1", b"B": b"x=y"}, 4):
        wrong.append("_launch_standby read the agent's go %s as %r" % (go["example_hex"], got))
    vb = go["kGoVersionBytes"]
    other = c["version"] + 1
    # Another version's header, then the rest; version 1's go was its magic, the length and the body.
    for version, head in ((other, example[:4] + struct.pack("<I", other)), (1, go["kGoMagicV1"].encode())):
        got = _read(s, head + example[vb:])
        want = "launch speaks worker contract version %d, this standby's Python module (_launch_standby) version %d" % (
            version, c["version"])
        if got[0] != "refused" or want not in got[1] or got[2] != 70:
            wrong.append("_launch_standby answered a go of version %d with %r, not a refusal naming both versions"
                         % (version, got))

    for line in wrong:
        print("contract_check: " + line)
    if not wrong:
        print("contract_check: the Python modules agree with launch_sdk/contract.h version %d" % c["version"])
    return 1 if wrong else 0


def _read(standby, go_bytes):
    """What _launch_standby._read_go makes of `go_bytes` (with four descriptors), in a child:
    ("go", env, descriptors), or ("refused", its line, its exit status)."""
    agent, mine = socket.socketpair()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            agent.close()
            env, fds = standby._read_go(mine)
            os.write(result_w, repr((sorted(env.items()), len(fds))).encode())
        finally:
            os._exit(0)  # never on into the checker's code
    mine.close()
    os.close(result_w)
    null = os.open(os.devnull, os.O_RDONLY)
    socket.send_fds(agent, [go_bytes], [null] * 4)
    agent.shutdown(socket.SHUT_WR)  # a standby that waits for more reads the end instead
    os.close(null)
    _, status = os.waitpid(pid, 0)
    result = os.read(result_r, 1 << 16)
    os.close(result_r)
    agent.settimeout(10)
    said = b""
    while not said.endswith(b"\n"):
        try:
            chunk = agent.recv(4096)
        except OSError:
            break
        if not chunk:
            break
        said += chunk
    agent.close()
    if result:
        items, nfds = ast.literal_eval(result.decode())
        return ("go", dict(items), nfds)
    return ("refused", said.decode(errors="replace"), os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    sys.exit(main())
