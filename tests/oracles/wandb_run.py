# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: reads a W&B run written by titan with the wandb package's own reader of .wandb transaction logs
(`wandb leet inspect --json`, its wandb-core binary, the reader `wandb sync` uploads from) and checks it.

usage:
  wandb_run.py run <run folder> <metrics.jsonl> [--config=config.json] [--keys=K,...] [--min-steps=N]
                   [--min-keys=N] [--exit-code=N|none] [--project=P] [--run-id=I] [--tags=T,...]
      The run's history equals the JSONL: one row per step holding every number of that step's lines (a
      training log and a validation result merged, as wandb.log merges a step), each value equal (floats
      exactly: both sides are JSON of the same double; NaN and the infinities as Python's json writes them);
      with --keys only those keys' values are compared (another rank's run: its loss, not its tps), the
      (key, step) pairs always in full. At least N steps and N keys (default 1: two empty runs do not match).
      The summary holds the last value of every key. --config: the run's config equals that JSON file.
      --exit-code: the exit record's code, or `none` for a run without one (a crashed run, or one read while
      it trains). `wandb sync --dry-run` lists the run as one to upload.
  wandb_run.py records <run file> <expected.json>
      The log holds exactly the records of expected.json ([{"num": N, "pad": L}, ...]: a header first, then
      history records whose one item "pad" is a string of L characters), in order.
Exit status 0 when everything matches.
"""
import json
import math
import os
import subprocess
import sys

from metrics_jsonl import compare, jsonl_values

META = {"_step", "_runtime", "_timestamp"}
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def inspect(path, *flags):
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", *flags, path],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"wandb leet inspect {path} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def number(value):
    return NON_FINITE.get(value, value) if isinstance(value, str) else value


def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b  # leet prints 10.0 as 10: JSON numbers, compared as numbers


def check_run(folder, jsonl, flags, errors):
    records = [json.loads(line) for line in inspect(folder).splitlines() if line.strip()]
    summary = json.loads(inspect(folder, "--summary"))
    types = [r["type"] for r in records]
    if types[:2] != ["header", "run"]:
        errors.append(f"expected a header then the run record first, got {types[:2]}")
    run = next((r["run"] for r in records if r["type"] == "run"), {})
    for flag, field in (("project", "project"), ("run-id", "run_id")):
        if flag in flags and run.get(field) != flags[flag]:
            errors.append(f"run {field}: expected {flags[flag]!r}, got {run.get(field)!r}")
    if "tags" in flags and summary.get("tags") != flags["tags"].split(","):
        errors.append(f"tags: expected {flags['tags']!r}, got {summary.get('tags')!r}")
    if "config" in flags:
        with open(flags["config"]) as f:
            config = json.load(f)
        if summary.get("config") != config:
            keys = sorted(set(config) ^ set(summary.get("config", {})))
            errors.append(f"config differs from {flags['config']} (keys only on one side: {keys})")

    expected = jsonl_values(jsonl)  # (key, step) -> value
    got, steps = {}, []
    for r in records:
        if r["type"] != "history":
            continue
        row = r["history"]["item"]
        step = r["history"]["step"]["num"]
        steps.append(step)
        if row.get("_step") != step:
            errors.append(f"history row of step {step} has _step {row.get('_step')}")
        for key, value in row.items():
            if key not in META:
                got[(key, step)] = number(value)
    if len(steps) != len(set(steps)):
        errors.append(f"expected one history row per step, got steps {steps}")
    only = set(flags["keys"].split(",")) if "keys" in flags else None
    more, compared = compare(expected, got, "run", same,
                             lambda key: f"{key}: run {got[key]!r}, JSONL {expected[key]!r}", only)
    errors += more
    last = {}
    for (key, step) in sorted(got, key=lambda ks: ks[1]):
        last[key] = got[(key, step)]
    for key, value in last.items():
        if (only is None or key in only) and not same(number(summary.get("summary", {}).get(key)), value):
            errors.append(f"summary {key}: {summary.get('summary', {}).get(key)!r}, last row {value!r}")
    keys = {key for key, _ in got}
    min_steps, min_keys = int(flags.get("min-steps", 1)), int(flags.get("min-keys", 1))
    if len(set(steps)) < min_steps or len(keys) < min_keys:
        errors.append(f"expected values at >= {min_steps} steps of >= {min_keys} keys, got {len(set(steps))} "
                      f"steps, {len(keys)} keys")
    if compared == 0:
        errors.append("no value was compared")

    exits = [r["exit"] for r in records if r["type"] == "exit"]
    want = flags.get("exit-code", "0")
    if want == "none":
        if exits:
            errors.append(f"expected no exit record, got {exits}")
    elif len(exits) != 1 or exits[0].get("exit_code", 0) != int(want) or types[-1] != "exit":
        errors.append(f"expected one exit record with code {want} at the end, got {exits} (last {types[-1]})")
    elif summary.get("exit_code", 0) != int(want):
        errors.append(f"summary exit_code {summary.get('exit_code')}, expected {want}")

    sync = subprocess.run([sys.executable, "-m", "wandb", "sync", "--dry-run", folder],
                          capture_output=True, text=True, timeout=120)
    run_file = [name for name in os.listdir(folder) if name.endswith(".wandb")]
    if sync.returncode != 0 or len(run_file) != 1 or run_file[0] not in sync.stdout + sync.stderr:
        errors.append(f"wandb sync --dry-run does not list {run_file}: {sync.stdout}{sync.stderr}")
    print(f"{len(got)} values of {len(keys)} keys at steps {steps}; {compared} compared; state "
          f"{summary.get('state')}, exit {exits}")


def check_records(path, expected_file, errors):
    with open(expected_file) as f:
        expected = json.load(f)
    records = [json.loads(line) for line in inspect(path).splitlines() if line.strip()]
    got = []
    for r in records:
        if r["type"] == "history":
            got.append({"num": r["num"], "pad": len(r["history"]["item"].get("pad", ""))})
        else:
            got.append({"num": r["num"], "type": r["type"]})
    if not got or got[0].get("type") != "header":
        errors.append(f"expected the header record first, got {got[:1]}")
    if got[1:] != expected:
        diffs = [(e, g) for e, g in zip(expected, got[1:]) if e != g]
        errors.append(f"expected {len(expected)} history records, got {len(got) - 1}; first differences {diffs[:3]}")
    print(f"{len(got)} records read, {sum(r.get('pad', 0) for r in got)} bytes of padding strings")


def main():
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    errors = []
    try:
        if args[0] == "run":
            check_run(args[1], args[2], flags, errors)
        elif args[0] == "records":
            check_records(args[1], args[2], errors)
        else:
            errors.append(f"unknown command {args[0]}")
    except (RuntimeError, ValueError, KeyError) as e:
        errors.append(f"{type(e).__name__}: {e}")
    for e in errors[:20]:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
