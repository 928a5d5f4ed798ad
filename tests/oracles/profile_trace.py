# SPDX-License-Identifier: BSD-3-Clause
"""Checks titan's profiler traces: each file is Chrome-trace JSON (what chrome://tracing and Perfetto
open) with aten::mm events and titan's FSDP ranges in order: inside the forward, each unit's all-gather
wait ends before the matrix multiplies that follow it, and every unit's all-gather was issued no later
than its wait ended.

usage: profile_trace.py [--require NAME]... TRACE.json...
Exit 0 when every check holds; prints what failed otherwise.
"""
import json
import sys


def fail(msg):
    print(f"profile_trace.py: {msg}")
    sys.exit(1)


def check(path, required):
    with open(path) as f:
        trace = json.load(f)
    events = trace.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail(f"{path}: no traceEvents list")
    ops = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    for e in ops:
        e["end"] = e["ts"] + float(e.get("dur", 0))
    names = {e["name"] for e in ops}
    mms = sorted((e for e in ops if e["name"] == "aten::mm"), key=lambda e: e["ts"])
    if not mms:
        fail(f"{path}: no aten::mm events")
    for name in required:
        if not any(n == name or n.startswith(name) for n in names):
            fail(f"{path}: no event named {name!r} (have {sorted(n for n in names if not n.startswith('aten::'))})")
    forwards = sorted((e for e in ops if e["name"] == "titan::forward"), key=lambda e: e["ts"])
    if not forwards:
        fail(f"{path}: no titan::forward range")
    fwd = forwards[0]
    inside = lambda e: e["ts"] >= fwd["ts"] and e["ts"] <= fwd["end"]
    waits = sorted((e for e in ops if e["name"].startswith("FSDP::all_gather_wait ") and inside(e)),
                   key=lambda e: e["ts"])
    units = [w["name"][len("FSDP::all_gather_wait "):] for w in waits]
    if len(waits) < 2 or len(set(units)) != len(units):
        fail(f"{path}: expected each FSDP unit's all-gather wait once in the forward, got {units}")
    fwd_mms = [m for m in mms if inside(m)]
    if not fwd_mms or fwd_mms[0]["ts"] < waits[0]["end"]:
        fail(f"{path}: a matrix multiply of the forward starts before the first unit's all-gather ended")
    layer_units = 0
    for i, w in enumerate(waits):
        until = waits[i + 1]["ts"] if i + 1 < len(waits) else fwd["end"]
        between = [m for m in fwd_mms if m["ts"] >= w["end"] and m["ts"] < until]
        if units[i].startswith("layers."):
            layer_units += 1
            if not between:
                fail(f"{path}: no aten::mm after unit {units[i]}'s all-gather and before the next unit's")
        issued = [e for e in ops if e["name"] == "FSDP::all_gather " + units[i] and e["ts"] <= w["end"]]
        if not issued:
            fail(f"{path}: unit {units[i]}'s all-gather was not issued before its wait ended")
    if layer_units == 0:
        fail(f"{path}: no layers.* unit among {units}")
    print(f"{path}: {len(ops)} ranges, {len(mms)} aten::mm, forward units in order: {', '.join(units)}")


def main(argv):
    required, paths = [], []
    i = 0
    while i < len(argv):
        if argv[i] == "--require":
            required.append(argv[i + 1])
            i += 2
        else:
            paths.append(argv[i])
            i += 1
    if not paths:
        fail("no trace files given")
    for p in paths:
        check(p, required)


if __name__ == "__main__":
    main(sys.argv[1:])
