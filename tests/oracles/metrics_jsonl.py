# SPDX-License-Identifier: BSD-3-Clause
"""metrics.jsonl as the oracles of titan's metrics sinks compare against it (tensorboard_events.py,
wandb_run.py): every number of every line, by (name, step); a later line's value of a step wins. compare()
holds what both oracles check of a sink's (name, step) -> value against it."""
import json


def jsonl_values(path):
    values = {}  # (name, step) -> value
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            step = record.pop("step")
            for name, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    values[(name, step)] = value
    return values


def compare(expected, got, sink, equal, describe, only=None):
    """The errors of `got` (a sink's (name, step) -> value) against the JSONL's `expected`: the same pairs, and
    equal(got, expected) for each (with `only`, a set of names, those names' values only); and the count of
    values compared. describe(key) words a differing value."""
    errors = []
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing:
        errors.append(f"{len(missing)} JSONL values missing from the {sink}, first {missing[:5]}")
    if extra:
        errors.append(f"{len(extra)} {sink} values not in the JSONL, first {extra[:5]}")
    compared = 0
    for key in sorted(set(expected) & set(got)):
        if only is not None and key[0] not in only:
            continue
        compared += 1
        if not equal(got[key], expected[key]):
            errors.append(describe(key))
    return errors, compared
