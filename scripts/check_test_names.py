#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Every Catch2 TEST_CASE name under tests/ is one ctest test: catch_discover_tests hands ctest the names as
a CMake list, so a ';' in a name splits it into two tests that match nothing (and fail), and a name that
repeats another's is run twice under one. Prints each offender with its file and line; exits 1 if any.

  scripts/check_test_names.py --root .                       # the tree
  scripts/check_test_names.py --root . --inject 'a; b'       # a synthetic bad name must be caught
(in --inject, "<semicolon>" also stands for ';', which a CMake test command cannot pass)
"""
import argparse
import pathlib
import re
import sys

NAME = re.compile(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
PIECE = re.compile(r'"((?:[^"\\]|\\.)*)"')


def names(root: pathlib.Path):
    for path in sorted((root / "tests").rglob("*.cpp")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in NAME.finditer(text):
            yield path.relative_to(root), text.count("\n", 0, m.start()) + 1, "".join(PIECE.findall(m.group(1)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=".", type=pathlib.Path)
    parser.add_argument("--inject", help="check this name too, as if a test had it (<semicolon> stands for ';')")
    args = parser.parse_args()
    found = list(names(args.root))
    if args.inject is not None:
        found.append((pathlib.Path("<injected>"), 0, args.inject.replace("<semicolon>", ";")))
    bad = []
    seen = {}
    for path, line, name in found:
        if ";" in name:
            bad.append(f"{path}:{line}: test name contains ';' (ctest splits it into two tests): {name!r}. "
                       "Use ',' or 'and'.")
        if name in seen:
            bad.append(f"{path}:{line}: test name repeats {seen[name]}: {name!r}. Rename one.")
        seen.setdefault(name, f"{path}:{line}")
    for b in bad:
        print(b)
    if not bad:
        print(f"test names ok: {len(found)} TEST_CASEs, none with ';', none repeated")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
