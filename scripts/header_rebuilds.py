#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""What a one-line change to a titan header costs: the objects that include it (ninja's dependency log)
and the sum of their last compile times (ninja's build log), divided over the build's jobs.

    scripts/header_rebuilds.py [--build build] [--jobs 2] [--top 30] [prefix ...]

Prefixes filter headers under include/titan (e.g. core/ layout/ parallel/). The estimate leaves out the
relinks (a few seconds) and assumes the logged compile times are those of a full build on this machine.
"""
import argparse
import collections
import re
import subprocess
import sys


def compile_seconds(build):
    seconds = {}
    with open(f"{build}/.ninja_log") as log:
        for line in log:
            if line.startswith("#"):
                continue
            start, end, _, output, _ = line.rstrip("\n").split("\t")
            seconds[output] = (int(end) - int(start)) / 1000  # the last entry of an output wins
    return seconds


def dependents(build):
    deps = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True, check=True).stdout
    users = collections.defaultdict(set)
    target = None
    for line in deps.splitlines():
        if line and not line.startswith(" "):
            target = line.split(":")[0]
            continue
        header = re.search(r"include/titan/(.+\.hpp)$", line.strip())
        if header and target and target.endswith(".o"):
            users[header.group(1)].add(target)
    return users


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("prefixes", nargs="*", default=[""])
    args = parser.parse_args()
    try:
        seconds = compile_seconds(args.build)
        users = dependents(args.build)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"[header_rebuilds] expected a ninja build in {args.build}, got: {e}. Build first, or pass --build.")
    rows = [(h, objs) for h, objs in users.items() if any(h.startswith(p) for p in args.prefixes)]
    rows.sort(key=lambda row: -len(row[1]))
    print(f"| header | objects | compile s | minutes at -j{args.jobs} |")
    print("| --- | ---: | ---: | ---: |")
    for header, objs in rows[: args.top]:
        total = sum(seconds.get(o, 0) for o in objs)
        print(f"| include/titan/{header} | {len(objs)} | {total:.0f} | {total / args.jobs / 60:.1f} |")


if __name__ == "__main__":
    main()
