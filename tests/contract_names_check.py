"""Checks that each LAUNCH_* environment variable is spelled once in launch's C++ sources.

    contract_names_check.py SOURCE_ROOT

The names launch and its workers share are launch_sdk/contract.h's, the ones launch reads for
itself common/launch_env.h's; everything else uses their constants. A string literal that begins
with a LAUNCH_* name anywhere else in agent/, launcher/, common/, probes/, rendezvous/, doctor/ or worker_sdk/ (tests and docs
aside) is a second spelling: printed with its place, and the exit status is 1.
"""

import os
import re
import sys

DECLARED_IN = {"worker_sdk/contract/include/launch_sdk/contract.h", "common/launch_env.h"}
LITERAL = re.compile(r'"(LAUNCH_[A-Z0-9_]+)')


def main():
    root = sys.argv[1]
    found = []
    for top in ("agent", "launcher", "common", "probes", "rendezvous", "doctor", "worker_sdk"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if rel in DECLARED_IN:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        for m in LITERAL.finditer(line):
                            found.append("%s:%d: %s spelled again; use its constant (%s)"
                                         % (rel, lineno, m.group(1), " or ".join(sorted(DECLARED_IN))))
    for line in found:
        print("contract_names_check: " + line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
