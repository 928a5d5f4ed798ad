#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Every multi-rank mesh or group a test builds in-process runs on the strict backend (Gloo with NCCL's rules),
unless the test says why not. The library's default backend is plain Gloo, so a test gets strict only by asking:
through test::mesh_options() (tests/dist/rank_test_util.hpp) or options that name a backend. Reported, with file and
line, under tests/:

  - a dist::Mesh built with a store (shape, rank, store) and no options: the library's default, plain Gloo;
  - a MeshOptions or GroupOptions written out (a variable, or braces passed to Mesh or ProcessGroup::create)
    that does not name its backend;
  - `.backend = "gloo"` or `"--comm.backend", "gloo"` without a `// plain Gloo: <why>` comment on one of the
    three lines above it (docs/testing.md lists these exceptions).

Tests that start processes get strict from Subprocess (tests/dist/subprocess.hpp, strict_by_default).

  scripts/check_strict_tests.py --root .
  scripts/check_strict_tests.py --root . --inject 'tests/x_test.cpp=dist::Mesh mesh(shape, rank, store);' \\
      --expect 'plain Gloo by default'
"""
import argparse
import pathlib
import re
import sys

MESH = re.compile(r"\bMesh\s*(?:\w+\s*)?\(")
CREATE = re.compile(r"\bProcessGroup::create\s*\(")
OPTIONS_VAR = re.compile(r"\b(MeshOptions|GroupOptions)\s+\w+\s*(?:=\s*)?\{")
GLOO = re.compile(r'\.backend\s*=\s*"gloo"|"--comm\.backend"\s*,\s*"gloo"|"--fault_tolerance\.process_group"\s*,'
                  r'\s*"gloo"')
REASON = "plain Gloo:"
HARNESS = pathlib.Path("tests/dist/rank_test_util.hpp")


def closing(text: str, start: int, open_char: str, close_char: str) -> int:
    """Index just past the bracket that closes the one at text[start]."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == '"':  # skip string literals (they may hold brackets)
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == open_char:
            depth += 1
        elif c == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def arguments(text: str) -> list:
    """The top-level comma-separated pieces of an argument list (without its parentheses)."""
    pieces, depth, current = [], 0, ""
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            pieces.append(current.strip())
            current = ""
        else:
            current += c
    if current.strip():
        pieces.append(current.strip())
    return pieces


def line_of(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def problems(rel: pathlib.Path, text: str):
    # Comments out (kept as spaces, so offsets and lines hold), except for the reason check below.
    code = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)
    for m in MESH.finditer(code):
        open_at = m.end() - 1
        args = arguments(code[open_at + 1:closing(code, open_at, "(", ")") - 1])
        if len(args) < 3:
            continue  # the one-process mesh, or not a constructor call
        if len(args) == 3:
            yield (line_of(code, m.start()), "a multi-rank Mesh without options runs on plain Gloo by default: pass "
                   "test::mesh_options() (tests/dist/rank_test_util.hpp)")
        elif args[3].startswith("{") and ".backend" not in args[3]:
            yield (line_of(code, m.start()), "these Mesh options name no backend (plain Gloo by default): use "
                   "test::mesh_options() or name it")
    for m in CREATE.finditer(code):
        open_at = m.end() - 1
        args = arguments(code[open_at + 1:closing(code, open_at, "(", ")") - 1])
        if args and args[-1].startswith("{") and ".backend" not in args[-1]:
            yield (line_of(code, m.start()), "these GroupOptions name no backend (plain Gloo by default): name it")
    if rel != HARNESS:
        for m in OPTIONS_VAR.finditer(code):
            body = code[m.end() - 1:closing(code, m.end() - 1, "{", "}")]
            if ".backend" not in body:
                yield (line_of(code, m.start()), f"this {m.group(1)} names no backend (plain Gloo by default): use "
                       "test::mesh_options() or name it")
    lines = text.split("\n")
    for m in GLOO.finditer(code):
        number = line_of(code, m.start())
        above = lines[max(0, number - 4):number]
        if not any(REASON in line for line in above):
            yield (number, f"plain Gloo without a reason: put a '// {REASON} <why>' comment above it and list the "
                   "test in docs/testing.md")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=".", type=pathlib.Path)
    parser.add_argument("--inject", action="append", default=[], metavar="FILE=CODE",
                        help="check CODE as if it ended FILE (a path under the root)")
    parser.add_argument("--expect", help="succeed only if the check fails and reports this text")
    args = parser.parse_args()
    sources = {}
    for path in sorted((args.root / "tests").rglob("*")):
        if path.suffix in (".cpp", ".hpp"):
            sources[path.relative_to(args.root)] = path.read_text(encoding="utf-8", errors="replace")
    for item in args.inject:
        rel, code = item.split("=", 1)
        sources[pathlib.Path(rel)] = sources.get(pathlib.Path(rel), "") + "\n" + code + "\n"
    found = [f"{rel}:{line}: {why}" for rel, text in sources.items() for line, why in problems(rel, text)]
    report = "\n".join(found)
    if args.expect is not None:
        if args.expect in report:
            print(f"caught as expected:\n{report}")
            return 0
        print(f"expected a report containing '{args.expect}', got:\n{report or '(none)'}")
        return 1
    if found:
        print("[titan::strict_tests] expected every in-process multi-rank test on the strict backend or a reason, "
              "got:\n" + report)
        return 1
    print(f"strict tests ok: {len(sources)} test sources, every multi-rank mesh and group on the strict backend or "
          "with its reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())
