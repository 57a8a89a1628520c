#!/usr/bin/python3
"""Run Debian's torchrun (torch 1.13) with one Python 3.11 fix applied at run time.

torch 1.13's ``Std.from_str`` looks a value up by iterating ``Std``, an IntFlag. On
Python 3.11 iterating a Flag yields only its canonical single-bit members (OUT, ERR),
skipping NONE (0) and ALL (3), so ``from_str("0")`` -- the default for --redirects and
--tee -- returns None and torchrun crashes. This wrapper replaces ``Std.from_str`` with
an equivalent that converts the value directly, then calls torch.distributed.run.main().
No installed file is modified.

Usage: /usr/bin/python3 bench/torchrun_patched.py [torchrun flags] PROGRAM [ARGS...]
"""
import re
import sys
from typing import Dict, Union

from torch.distributed.elastic.multiprocessing import api as _mp_api

Std = _mp_api.Std
# Use torch's own regexes so accepted inputs match 1.13 exactly.
_VALUE_REGEX = getattr(_mp_api, "_VALUE_REGEX", r"^[0123]$")
_MAPPING_REGEX = getattr(_mp_api, "_MAPPING_REGEX", r"^(\d:[0123],)*(\d:[0123])$")


def _from_str(cls, vm: str) -> Union["Std", Dict[int, "Std"]]:
    """from_str("0") -> Std.NONE; from_str("0:3,1:0") -> {0: Std.ALL, 1: Std.NONE}.

    Any other input raises ValueError (as in torch 1.13).
    """

    def to_std(v: str) -> "Std":
        # Std(n) works for every n in 0..3, including the NONE and ALL values that
        # iteration skips on Python 3.11.
        return cls(int(v))

    if re.match(_VALUE_REGEX, vm):  # a number, e.g. "0"
        return to_std(vm)
    elif re.match(_MAPPING_REGEX, vm):  # a mapping, e.g. "0:1,1:2"
        d: Dict[int, Std] = {}
        for m in vm.split(","):
            i, v = m.split(":")
            d[int(i)] = to_std(v)
        return d
    else:
        raise ValueError(f"{vm} does not match: <{_VALUE_REGEX}> or <{_MAPPING_REGEX}>")


Std.from_str = classmethod(_from_str)


def main() -> None:
    from torch.distributed import run as _run

    sys.argv[0] = "torchrun"
    _run.main()


if __name__ == "__main__":
    main()
