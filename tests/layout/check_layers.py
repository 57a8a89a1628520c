#!/usr/bin/env python3
"""Fails when one of launch's libraries includes a header of a library above it.

The build already refuses such an include in a source file: each library is its own include root
and sees only what it links (cmake/include_root.cmake). This check covers what the build does not
compile on its own: a header that no source file of its library includes. The order of the layers
is read from cmake/include_root.cmake, the one place that declares it.
Usage: check_layers.py SOURCE_DIR.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]+"', re.M)
ORDER = re.compile(r"^#\s+(\w+(?:\s+<\s+\w+)+)\s*$", re.M)


def layers(src):
    with open(os.path.join(src, "cmake", "include_root.cmake"), encoding="utf-8") as f:
        found = ORDER.findall(f.read())
    if len(found) != 1:
        sys.exit("check_layers.py: cmake/include_root.cmake must declare the layers once, as "
                 "'#   a < b < c'; found %d such lines" % len(found))
    return [name.strip() for name in found[0].split("<")]


def violations(src, order):
    rank = {name: i for i, name in enumerate(order)}
    out = []
    for layer in order:
        for dirpath, _, names in os.walk(os.path.join(src, layer)):
            for name in sorted(names):
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for folder in INCLUDE.findall(text):
                    if folder in rank and rank[folder] > rank[layer]:
                        out.append("%s includes %s/, a layer above %s/" %
                                   (os.path.relpath(path, src), folder, layer))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_layers.py SOURCE_DIR")
    order = layers(sys.argv[1])
    bad = violations(sys.argv[1], order)
    for line in bad:
        print(line)
    if bad:
        return 1
    print("check_layers.py: %s: no include reaches up a layer" % " < ".join(order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
