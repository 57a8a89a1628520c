#!/usr/bin/env python3
"""Fails when launch's own sources include each other in a cycle.

A module is a header and its source file together (agent/foo.h + agent/foo.cc): module A depends
on module B when either of A's files includes B's header. A cycle between modules means neither can
be understood, tested or moved without the other. Usage: check_include_cycles.py SOURCE_DIR.
"""
import os
import re
import sys

ROOTS = ("agent", "common", "doctor", "launcher", "probes", "proto", "rendezvous", "worker_sdk")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def modules(src):
    """Maps each module (path without extension) to the project headers its files include."""
    headers = {}  # include spelling -> module
    files = []
    for root in ROOTS:
        for dirpath, _, names in os.walk(os.path.join(src, root)):
            for name in names:
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), src)
                files.append(path)
                if name.endswith(".h"):
                    stem = path[:-2]
                    headers[path] = stem
                    # Headers under an include/ root are included by their path below it.
                    if "/include/" in path:
                        headers[path.split("/include/", 1)[1]] = stem
    deps = {}
    for path in files:
        stem = path.rsplit(".", 1)[0]
        with open(os.path.join(src, path), encoding="utf-8") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            target = headers.get(inc)
            if target and target != stem:
                deps.setdefault(stem, set()).add(target)
        deps.setdefault(stem, set())
    return deps


def cycles(deps):
    """Every strongly connected set of more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(deps.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 2:
        print("usage: check_include_cycles.py SOURCE_DIR", file=sys.stderr)
        return 2
    deps = modules(sys.argv[1])
    found = cycles(deps)
    for group in found:
        edges = [f"{a} -> {b}" for a in group for b in sorted(deps[a]) if b in group]
        print(f"include cycle among {', '.join(group)}: {'; '.join(edges)}")
    if found:
        return 1
    print(f"no include cycle among {len(deps)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
