#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Every test's duration from one ctest run, as a Markdown table (slowest first, the total, the wall time).

  ctest --test-dir build -j2 --output-junit "$PWD/ctest.xml"        # ctest writes JUnit XML
  scripts/test_durations.py ctest.xml --top 20 --wall 1234 --command "ctest ... -j2" > docs/test_durations.md
  scripts/test_durations.py build/Testing/Temporary/LastTest.log ...   # or ctest's own log of its last run

`--wall` is the run's elapsed seconds (with -j2 two tests run at once, so the sum of durations is more than
the wall time). The header says when, on which CPU (lscpu's model name) and with which command.
"""
import argparse
import re
import datetime
import subprocess
import sys
import xml.etree.ElementTree as ET


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def read_last_test_log(path):
    """ctest's own record of its last run (build/Testing/Temporary/LastTest.log): no --output-junit needed."""
    cases, name, seconds = [], None, 0.0
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^\d+/\d+ Testing: (.*)$", line.rstrip("\n"))
            if m:
                name = m.group(1)
                continue
            m = re.match(r"^Test time =\s*([0-9.]+) sec", line)
            if m:
                seconds = float(m.group(1))
            elif name is not None and line.startswith(("Test Passed", "Test Failed")):
                cases.append((name, seconds, "passed" if line.startswith("Test Passed") else "failed"))
                name = None
    if not cases:
        sys.exit(f"[test_durations] expected 'N/M Testing:' blocks in {path}, got none. Pass ctest's "
                 "Testing/Temporary/LastTest.log or an --output-junit file.")
    return cases


def read_junit(path):
    if not path.endswith(".xml"):
        return read_last_test_log(path)
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        status = case.get("status") or ("failed" if case.find("failure") is not None else "run")
        cases.append((case.get("name"), float(case.get("time") or 0.0), status))
    if not cases:
        sys.exit(f"[test_durations] expected <testcase> elements in {path}, got none. Run ctest with --output-junit.")
    return cases


def run_date(path):
    """When the run started (the JUnit file's timestamp, ctest's local time, UTC here), else now."""
    if path.endswith(".xml"):
        stamp = ET.parse(path).getroot().get("timestamp")
        if stamp:
            return stamp.replace("T", " ")[:16] + " UTC"
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", help="ctest --output-junit file (.xml), or ctest's build/Testing/Temporary/LastTest.log")
    ap.add_argument("--top", type=int, default=20, help="rows in the table")
    ap.add_argument("--wall", type=float, default=0.0, help="the run's wall-clock seconds")
    ap.add_argument("--command", default="ctest --test-dir build --output-on-failure -j2",
                    help="the command that made the file")
    a = ap.parse_args()
    cases = read_junit(a.junit)
    # ctest's JUnit marks a test that exited with its SKIP_RETURN_CODE "notrun" (the CUDA tests without a GPU).
    skipped = [c for c in cases if c[2] == "notrun"]
    cases.sort(key=lambda c: -c[1])
    total = sum(c[1] for c in cases)
    failed = [c for c in cases if c[2] not in ("run", "passed", "notrun")]
    date = run_date(a.junit)
    print("# Test durations\n")
    print(f"Measured {date} on {cpu_model()} (2 cores), `{a.command}`; made by `scripts/test_durations.py`.\n")
    wall = f", wall {a.wall / 60:.1f} min" if a.wall > 0 else ""
    print(f"{len(cases)} tests, {len(failed)} not passed, {len(skipped)} skipped; durations sum to {total:.0f} s ({total / 60:.1f} min){wall}.\n")
    print(f"| # | test | s | share |")
    print("|---:|---|---:|---:|")
    for i, (name, t, status) in enumerate(cases[: a.top], 1):
        mark = "" if status in ("run", "passed") else f" ({status})"
        print(f"| {i} | {name.replace('|', '/')}{mark} | {t:.1f} | {100 * t / total:.1f}% |")
    rest = sum(c[1] for c in cases[a.top:])
    print(f"| | the other {max(0, len(cases) - a.top)} tests | {rest:.1f} | {100 * rest / total:.1f}% |")


if __name__ == "__main__":
    main()
