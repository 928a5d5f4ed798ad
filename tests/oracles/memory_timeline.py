# SPDX-License-Identifier: BSD-3-Clause
"""Checks titan's CPU memory timelines (format titan.memory_timeline v1, docs/observability.md) of one
rank: the files continue one another, each event's total is the running sum, and, with METRICS.jsonl,
the peak of activations and of communication between two peak resets (one per logged step) equals the
trainer's reported memory/activations(GiB) and memory/communication(GiB) of that step.

usage: memory_timeline.py [--metrics METRICS.jsonl] TIMELINE.json...   (files in step order)
"""
import json
import sys

GIB = 1024.0**3


def fail(msg):
    print(f"memory_timeline.py: {msg}")
    sys.exit(1)


def main(argv):
    metrics = None
    if argv and argv[0] == "--metrics":
        metrics, argv = argv[1], argv[2:]
    if not argv:
        fail("no timeline files given")
    live = None
    windows = []  # per category, the peak of each window between resets
    current = None
    for path in argv:
        with open(path) as f:
            t = json.load(f)
        if t.get("format") != "titan.memory_timeline" or t.get("version") != 1:
            fail(f"{path}: not a titan.memory_timeline v1 file")
        cats = t["categories"]
        if t["columns"] != ["time_us", "bytes", "category", "total_bytes"] or len(t["base_bytes"]) != len(cats):
            fail(f"{path}: unexpected columns or categories")
        if t["truncated"]:
            fail(f"{path}: truncated")
        base = list(t["base_bytes"])
        if live is not None and base != live:
            fail(f"{path}: base {base} does not continue the previous file's end {live}")
        live = base
        if current is None:
            current = list(live)
        resets = set(t["peak_resets"])
        total = sum(live)
        last_time = -1
        for i, (time_us, nbytes, cat, total_bytes) in enumerate(t["events"]):
            if i in resets:
                windows.append(current)
                current = list(live)
            if time_us < last_time:
                fail(f"{path}: event {i} goes back in time")
            last_time = time_us
            live[cat] += nbytes
            total += nbytes
            if total != total_bytes:
                fail(f"{path}: event {i}: total {total_bytes}, running sum {total}")
            current[cat] = max(current[cat], live[cat])
        if len(t["events"]) in resets:
            windows.append(current)
            current = list(live)
        if t["peak_total_bytes"] < max([sum(t["base_bytes"])] + [e[3] for e in t["events"]]):
            fail(f"{path}: peak_total_bytes below an event's total")
    print(f"{len(argv)} timeline files, {len(windows)} peak windows")
    if metrics is None:
        return
    records = [json.loads(line) for line in open(metrics) if "memory/activations(GiB)" in line]
    if len(records) != len(windows):
        fail(f"{len(records)} logged steps with memory parts, but {len(windows)} peak resets in the timeline")
    act, comm = cats.index("activations"), cats.index("communication")
    for r, w in zip(records, windows):
        for key, c in (("memory/activations(GiB)", act), ("memory/communication(GiB)", comm)):
            reported = r[key] * GIB
            if abs(reported - w[c]) > 1e-6 * max(1.0, w[c]):
                fail(f"step {r['step']}: {key} reports {reported:.0f} bytes, the timeline's peak is {w[c]}")
        print(f"step {r['step']}: activations peak {w[act]} B, communication peak {w[comm]} B (as reported)")


if __name__ == "__main__":
    main(sys.argv[1:])
