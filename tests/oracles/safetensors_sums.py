# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: reads a safetensors file with the safetensors package; writes {name: [shape, sum]} as JSON."""
import json
import sys

from safetensors.numpy import load_file

tensors = load_file(sys.argv[1])
with open(sys.argv[2], "w") as f:
    json.dump({k: [list(v.shape), float(v.astype("float64").sum())] for k, v in tensors.items()}, f)
