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

Without this module a script's steps are still seen: a worker started from a standby (launch's
warm start, on by default) counts its optimizer's steps (see _count_optimizer_steps), and the agent
uses them for live step rates, stragglers and an explicit --hang-timeout. The first step the script
reports itself ends that counting.

No dependencies beyond the standard library; the wire format is worker_sdk's
launch_sdk/progress.h (host byte order: the agent is on the same machine).
"""

import faulthandler
import functools
import os
import signal
import struct
import time
import weakref

__all__ = ["Reporter", "step"]

# launch_sdk/contract.h's and progress.h's, which tests/contract_check.py compares them with.
_PROGRESS_FD_ENV = "LAUNCH_PROGRESS_FD"
_STACK_FILE_ENV = "LAUNCH_STACK_FILE"
_PROGRESS = struct.Struct("=Iiqddd")  # magic, rank, step, loss, step_seconds, wait_seconds
_STACKS = struct.Struct("=Iiii")  # magic, rank, signal, reserved
_PROGRESS_MAGIC = 0x4C50524F  # "LPRO"
_COUNTED_MAGIC = 0x4C505243  # "LPRC": a step counted by launch, not named by the script
_STACKS_MAGIC = 0x4C53544B  # "LSTK"
_COUNT_STACKS_ENV = "LAUNCH_COUNTED_STACKS"  # "1": counted steps offer stacks too (--hang-timeout given)

_named = False  # the script reported a step itself: counted steps are no longer sent


def _env_int(name, default):
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0 <= value <= 2**31 - 1 else default


class Reporter:
    """Sends progress to launch's agent; a no-op when not run under launch."""

    def __init__(self, _offer_stacks=True):
        self._fd = _env_int(_PROGRESS_FD_ENV, -1)
        self._rank = _env_int("RANK", 0)
        self._last = None
        self._stack_file = None
        if self._fd >= 0 and _offer_stacks:
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
        global _named
        _named = True
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


class _OptimizerSteps:
    """Counts the steps of the script's first optimizer to step (while it lives) and reports each
    as a counted step through `reporter`. Of a step's time, the time spent in autograd's backward
    counts as waiting: DDP's gradient all-reduces end inside it, so a rank slower in its forward,
    data loading or optimizer shows as a straggler (one slower only in its backward does not)."""

    def __init__(self, reporter):
        self._reporter = reporter
        self._count = 0
        self._last = None
        self._lead = None
        self._backward = 0.0

    def stepped(self, optimizer):
        if _named or not self._reporter.enabled:
            return
        lead = self._lead() if self._lead is not None else None
        if lead is None:
            try:
                self._lead = weakref.ref(optimizer)
            except TypeError:
                return
        elif lead is not optimizer:
            return
        now = time.monotonic()
        step_seconds = 0.0 if self._last is None else now - self._last
        wait = min(self._backward, step_seconds)
        self._last, self._backward = now, 0.0
        self._count += 1
        r = self._reporter
        r._send(_PROGRESS.pack(_COUNTED_MAGIC, r._rank, self._count, 0.0, step_seconds, wait))

    def in_backward(self, seconds):
        self._backward += seconds


def _count_optimizer_steps(torch):
    """Reports every optimizer step of this process as a counted step (the worker's environment is
    in place; `torch` is imported). torch 2's global optimizer-step hook where it has one, else
    torch 1.13's profiler entry point that every optimizer's step calls when done. With
    --hang-timeout (LAUNCH_COUNTED_STACKS=1) the worker also offers its stacks, as a Reporter
    does. Returns whether steps are counted. Outside launch: nothing."""
    optim = getattr(torch, "optim", None)
    autograd = getattr(torch, "autograd", None)
    if _env_int(_PROGRESS_FD_ENV, -1) < 0 or optim is None or not callable(getattr(autograd, "backward", None)):
        return False
    register = getattr(getattr(optim, "optimizer", None), "register_optimizer_step_post_hook", None)
    step_code = getattr(getattr(optim, "Optimizer", None), "_optimizer_step_code", None)
    if register is None and step_code is None:
        return False
    counter = _OptimizerSteps(Reporter(_offer_stacks=os.environ.get(_COUNT_STACKS_ENV) == "1"))
    if register is not None:
        register(lambda optimizer, args, kwargs: counter.stepped(optimizer))
    else:
        def _optimizer_step_code(self):
            step_code(self)
            counter.stepped(self)

        optim.Optimizer._optimizer_step_code = _optimizer_step_code
    backward = autograd.backward

    @functools.wraps(backward)
    def timed_backward(*args, **kwargs):
        start = time.monotonic()
        try:
            return backward(*args, **kwargs)
        finally:
            counter.in_backward(time.monotonic() - start)

    autograd.backward = timed_backward
    return True


_default = None


def step(step, loss=0.0, step_seconds=None, wait_seconds=0.0):
    """Reports through one Reporter for the whole process."""
    global _default
    if _default is None:
        _default = Reporter()
    _default.step(step, loss, step_seconds, wait_seconds)
