# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: loads titan's TensorBoard event file with the tensorboard package's EventAccumulator and
checks it against metrics.jsonl: the same (tag, step) pairs, and every scalar equal to the JSONL value
rounded to float32 (the Summary's simple_value). A later JSONL line of a step wins, as in TensorBoard.

usage: tensorboard_events.py <folder with one events.out.tfevents.* file> <metrics.jsonl> [TAG,...]
                             [--min-steps=N] [--min-tags=N]
With TAG,..., only those tags' values are compared (another rank's file: its loss, not its tps);
the (tag, step) pairs are always compared in full. The event file must hold scalars at N distinct steps
and of N distinct tags at least (default 1 each: two empty files do not match). Exit status 0 when
everything matches.
"""
import glob
import os
import struct
import sys

from metrics_jsonl import compare, jsonl_values
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    folder, jsonl = args[0], args[1]
    only = set(args[2].split(",")) if len(args) > 2 else None
    min_steps, min_tags = int(flags.get("min-steps", 1)), int(flags.get("min-tags", 1))
    files = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    if len(files) != 1:
        print(f"expected one event file in {folder}, got {files}")
        return 1

    expected = {key: float(value) for key, value in jsonl_values(jsonl).items()}  # (tag, step) -> value

    acc = EventAccumulator(files[0], size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            got[(tag, event.step)] = event.value

    errors, compared = compare(
        expected, got, "event file", lambda g, e: g == float32(e),
        lambda key: f"{key}: event file {got[key]!r}, JSONL {expected[key]!r} (float32 {float32(expected[key])!r})",
        only)
    steps = sorted({step for _, step in got})
    tags = {tag for tag, _ in got}
    if len(steps) < min_steps or len(tags) < min_tags:
        errors.append(f"expected scalars at >= {min_steps} steps of >= {min_tags} tags, got {len(steps)} steps, {len(tags)} tags")
    if compared == 0:
        errors.append("no value was compared")
    for e in errors[:20]:
        print(e)
    print(f"{len(got)} scalars of {len({tag for tag, _ in got})} tags at steps {steps}; {compared} values compared")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
