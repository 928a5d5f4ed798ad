#!/usr/bin/env python3
"""Checks that titan/titan.hpp, the umbrella header, includes the whole public API: every header under
include/titan/ outside detail/ folders. Exit 1 names each one missing.

  scripts/check_umbrella.py                              check the repository
  scripts/check_umbrella.py --pretend-new titan/x/y.hpp  add a synthetic public header and require that it is caught
"""
import argparse
import os
import re
import sys


def public_headers(root):
    base = os.path.join(root, "include")
    for dirpath, dirnames, files in os.walk(os.path.join(base, "titan")):
        dirnames[:] = sorted(d for d in dirnames if d != "detail")
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, name), base).replace(os.sep, "/")
            if name.endswith(".hpp") and rel != "titan/titan.hpp":
                yield rel


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--pretend-new", action="append", default=[], metavar="HEADER",
                        help="treat HEADER (titan/...) as a public header too")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    umbrella = open(os.path.join(root, "include", "titan", "titan.hpp"), encoding="utf-8").read()
    included = set(re.findall(r'^#include "([^"]+)"', umbrella, re.M))
    missing = [h for h in list(public_headers(root)) + args.pretend_new if h not in included]
    for header in missing:
        print(f"include/titan/titan.hpp: missing #include \"{header}\" (a public header: add it, or move it to a "
              f"detail/ folder if it is machinery)")
    if missing:
        return 1
    print(f"titan/titan.hpp includes all {len(included)} public headers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
