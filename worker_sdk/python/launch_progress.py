"""Per-step progress from a Python worker to launch's agent: one line in a training loop.

    import launch_progress

    progress = launch_progress.Reporter()
    for step, batch in enumerate(loader):
        loss = train_step(batch)
        progress.step(step, loss.item())

launch puts this module on the workers' PYTHONPATH. Outside launch (LAUNCH_PROGRESS_FD unset)
every call is a no-op, so a script keeps working anywhere. The reports feed the failure table's
"last step" and hang detection (--hang-timeout): a rank whose steps stop is named, and before it
is stopped the agent asks for its stacks, which faulthandler writes for every Python thread to
LAUNCH_STACK_FILE (SIGUSR1 is used for that only when the program has not taken it itself).

No dependencies beyond the standard library; the wire format is worker_sdk's
launch_sdk/progress.h (host byte order: the agent is on the same machine).
"""

import faulthandler
import os
import signal
import struct
import time

__all__ = ["Reporter", "step"]

# launch_sdk/contract.h's and progress.h's, which tests/contract_check.py compares them with.
_PROGRESS_FD_ENV = "LAUNCH_PROGRESS_FD"
_STACK_FILE_ENV = "LAUNCH_STACK_FILE"
_PROGRESS = struct.Struct("=Iiqddd")  # magic, rank, step, loss, step_seconds, wait_seconds
_STACKS = struct.Struct("=Iiii")  # magic, rank, signal, reserved
_PROGRESS_MAGIC = 0x4C50524F  # "LPRO"
_STACKS_MAGIC = 0x4C53544B  # "LSTK"


def _env_int(name, default):
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0 <= value <= 2**31 - 1 else default


class Reporter:
    """Sends progress to launch's agent; a no-op when not run under launch."""

    def __init__(self):
        self._fd = _env_int(_PROGRESS_FD_ENV, -1)
        self._rank = _env_int("RANK", 0)
        self._last = None
        self._stack_file = None
        if self._fd >= 0:
            self._offer_stacks()

    @property
    def enabled(self):
        return self._fd >= 0

    def step(self, step, loss=0.0, step_seconds=None, wait_seconds=0.0):
        """Reports that `step` is done; its time is measured from the previous call if not given.

        wait_seconds: of the step's time, how much was spent waiting for the other ranks (e.g. in
        all-reduces), where the script measures it. launch compares the rest (each rank's own
        work) across ranks to find stragglers: under DDP every rank's whole step takes as long as
        the slowest one's."""
        if self._fd < 0:
            return
        now = time.monotonic()
        if step_seconds is None:
            step_seconds = 0.0 if self._last is None else now - self._last
        self._last = now
        self._send(_PROGRESS.pack(_PROGRESS_MAGIC, self._rank, int(step), float(loss), float(step_seconds),
                                  float(wait_seconds)))

    def _send(self, data):
        try:
            os.write(self._fd, data)
        except BlockingIOError:
            pass  # a full socket drops the report: progress never slows training down
        except OSError:
            self._fd = -1  # the descriptor is not launch's socket (closed by the program)

    def _offer_stacks(self):
        path = os.environ.get(_STACK_FILE_ENV, "")
        if not path or signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            return
        try:
            self._stack_file = open(path, "w")
            faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True)
        except (OSError, RuntimeError, ValueError):
            return
        self._send(_STACKS.pack(_STACKS_MAGIC, self._rank, int(signal.SIGUSR1), 0))


_default = None


def step(step, loss=0.0, step_seconds=None, wait_seconds=0.0):
    """Reports through one Reporter for the whole process."""
    global _default
    if _default is None:
        _default = Reporter()
    _default.step(step, loss, step_seconds, wait_seconds)
