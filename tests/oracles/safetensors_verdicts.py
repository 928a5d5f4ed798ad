# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: the reference safetensors reader's verdict on each *.safetensors file of a folder (the file
itself or every file in it); writes {file name: "ok" or the error message} as JSON.

  safetensors_verdicts.py <folder or file> <out.json>
"""
import json
import os
import sys

from safetensors.torch import load_file  # torch: bfloat16 too (numpy has none)

target, out = sys.argv[1], sys.argv[2]
paths = [target] if os.path.isfile(target) else [
    os.path.join(target, n) for n in sorted(os.listdir(target)) if n.endswith(".safetensors")]
verdicts = {}
for path in paths:
    try:
        load_file(path)
        verdicts[os.path.basename(path)] = "ok"
    except Exception as e:  # the reader's SafetensorError, or an OS error
        verdicts[os.path.basename(path)] = f"{type(e).__name__}: {e}"
with open(out, "w") as f:
    json.dump(verdicts, f)
