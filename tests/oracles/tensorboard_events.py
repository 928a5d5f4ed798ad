# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: loads titan's TensorBoard event file with the tensorboard package's EventAccumulator and
checks it against metrics.jsonl: the same (tag, step) pairs, and every scalar equal to the JSONL value
rounded to float32 (the Summary's simple_value). A later JSONL line of a step wins, as in TensorBoard.

usage: tensorboard_events.py <folder with one events.out.tfevents.* file> <metrics.jsonl> [TAG,...]
With TAG,..., only those tags' values are compared (another rank's file: its loss, not its tps);
the (tag, step) pairs are always compared in full. Exit status 0 when everything matches.
"""
import glob
import json
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    folder, jsonl = sys.argv[1], sys.argv[2]
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    files = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    if len(files) != 1:
        print(f"expected one event file in {folder}, got {files}")
        return 1

    expected = {}  # (tag, step) -> value
    with open(jsonl) as f:
        for line in f:
            record = json.loads(line)
            step = record.pop("step")
            for tag, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    expected[(tag, step)] = float(value)

    acc = EventAccumulator(files[0], size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            got[(tag, event.step)] = event.value

    errors = []
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing:
        errors.append(f"{len(missing)} JSONL scalars missing from the event file, first {missing[:5]}")
    if extra:
        errors.append(f"{len(extra)} event-file scalars not in the JSONL, first {extra[:5]}")
    compared = 0
    for key in sorted(set(expected) & set(got)):
        if only is not None and key[0] not in only:
            continue
        compared += 1
        if got[key] != float32(expected[key]):
            errors.append(f"{key}: event file {got[key]!r}, JSONL {expected[key]!r} (float32 {float32(expected[key])!r})")
    for e in errors[:20]:
        print(e)
    steps = sorted({step for _, step in got})
    print(f"{len(got)} scalars of {len({tag for tag, _ in got})} tags at steps {steps}; {compared} values compared")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
