#!/usr/bin/env python3
"""Checks that building the target titan_tests builds every program a test starts.

A test that starts build/bin/<name> runs whatever file is there: missing after a build of titan_tests
alone (the sanitizer build, scripts/sanitized_tests.sh), or stale from an older build. So titan_tests
depends on every such program (tests/CMakeLists.txt), and this check holds that list to what the tests start:

- the test sources (tests/**/*.cpp, *.hpp): `"bin" / "<name>"` paths and `run_tool("<name>", ...)`;
- ctest's commands (`ctest --show-only=json-v1`): every argument that is a file in <build>/bin, and the
  programs the Python scripts they run start (`os.path.join(build, "bin", "<name>")`).

titan_tests' dependencies are read from the build itself (`ninja -t query bin/titan_tests`). Exit 1 names each
program a test starts that building titan_tests does not build, and the file that starts it.

  scripts/check_test_programs.py --root . --build build             check
  scripts/check_test_programs.py --root . --build build --print     check, then print every program the tests
                                                                    start, one per line (titan_tests first)
  scripts/check_test_programs.py ... --inject tests/x.cpp='"bin" / "bench_moe"' --expect bench_moe
                                                                    add a synthetic start and require that it is caught
"""
import argparse
import json
import os
import re
import subprocess
import sys

CPP_STARTS = (re.compile(r'"bin"\s*/\s*"([\w.+-]+)"'), re.compile(r'\brun_tool\(\s*"([\w.+-]+)"'))
PY_STARTS = re.compile(r'"bin"\s*,\s*"([\w.+-]+)"')


def scan(text, patterns, rel, found, context=""):
    for pattern in patterns:
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.setdefault(match.group(1), f"{rel}:{line}{context}")


def read(root, rel, injected):
    text = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read()
    return text + "".join("\n" + extra for key, extra in injected if rel == key)


def started_by_sources(root, injected, found):
    for dirpath, _, files in os.walk(os.path.join(root, "tests")):
        for name in sorted(files):
            if name.endswith((".cpp", ".hpp")):
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                scan(read(root, rel, injected), CPP_STARTS, rel, found)


def started_by_ctest(root, build, injected, found):
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], check=True, capture_output=True,
                         text=True).stdout
    bin_dir = os.path.realpath(os.path.join(build, "bin"))
    root_real = os.path.realpath(root)
    for test in json.loads(out).get("tests", []):
        for arg in test.get("command", []):
            path = os.path.realpath(arg) if os.path.isabs(arg) else None
            if path and os.path.dirname(path) == bin_dir:
                found.setdefault(os.path.basename(path), f"ctest '{test['name']}'")
            elif path and path.endswith(".py") and path.startswith(root_real + os.sep) and os.path.isfile(path):
                rel = os.path.relpath(path, root_real).replace(os.sep, "/")
                scan(read(root, rel, injected), [PY_STARTS], rel, found, f" (run by ctest '{test['name']}')")


def built_with_tests(build):
    if not os.path.exists(os.path.join(build, "build.ninja")):
        sys.exit(f"[titan::test_programs] expected a Ninja build in {build} (build.ninja), got none. Configure it "
                 "with -G Ninja, as scripts/setup.sh does.")
    out = subprocess.run(["ninja", "-C", build, "-t", "query", "bin/titan_tests"], check=True, capture_output=True,
                         text=True).stdout
    return {line.split("bin/", 1)[1] for line in out.splitlines() if line.strip().startswith("|| bin/")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=".", help="the repository")
    parser.add_argument("--build", required=True, help="a configured build folder (Ninja)")
    parser.add_argument("--print", action="store_true", help="print every program the tests start")
    parser.add_argument("--inject", action="append", default=[], metavar="FILE=TEXT",
                        help="append TEXT to the repository file FILE (relative path) before scanning")
    parser.add_argument("--expect", help="succeed only if the check fails and names this program")
    args = parser.parse_args()
    injected = [tuple(item.split("=", 1)) for item in args.inject]
    found = {}  # program -> where a test starts it
    started_by_sources(args.root, injected, found)
    started_by_ctest(args.root, args.build, injected, found)
    built = built_with_tests(args.build) | {"titan_tests"}
    missing = sorted(name for name in found if name not in built)
    report = "".join(f"  {found[name]} starts bin/{name}\n" for name in missing)
    if args.expect is not None:
        caught = args.expect in missing
        heading = ("caught as expected" if caught else
                   f"expected {args.expect} reported as not built with titan_tests, got")
        print(f"{heading}:\n{report or '(no violation)'}")
        return 0 if caught else 1
    if missing:
        print("[titan::test_programs] expected every program a test starts to be a dependency of titan_tests, "
              f"got {len(missing)} that building titan_tests does not build:\n{report}"
              "Add each to _test_programs in tests/CMakeLists.txt.")
        return 1
    if args.print:
        print("\n".join(["titan_tests"] + sorted(found)))
    else:
        print(f"{len(found)} programs started by tests, each built with titan_tests: {', '.join(sorted(found))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
