# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: torchtitan 0.2.2's DeepSeek-V3 for the model tests (built on the meta device, no memory).

  torchtitan_deepseek_v3.py counts OUT.json SEQ_LEN   per flavor: parameter count, FLOPs per token at
                                                      SEQ_LEN, and (debugmodel, 236B) every parameter's
                                                      name and shape
  torchtitan_deepseek_v3.py freqs OUT.safetensors     precompute_freqs_cis (YaRN) of two configs, as
                                                      view_as_real (S, ROPE/2, 2)
"""
import copy
import json
import sys

import torch
from safetensors.torch import save_file
from torchtitan.models.deepseek_v3 import DeepSeekV3Model, deepseekv3_args
from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
from torchtitan.models.deepseek_v3.model.model import precompute_freqs_cis


def counts(out, seq_len):
    result = {}
    for name in ["debugmodel", "16B", "236B", "671B"]:
        args = copy.deepcopy(deepseekv3_args[name])
        args.max_seq_len = seq_len
        args.moe_impl = "standard"  # update_from_config's default
        with torch.device("meta"):
            model = DeepSeekV3Model(args)
        params, flops = args.get_nparams_and_flops(model, seq_len)
        entry = {"params": params, "flops": flops}
        if name in ("debugmodel", "236B"):
            entry["shapes"] = {n: list(p.shape) for n, p in model.named_parameters()}
        result[name] = entry
    with open(out, "w") as f:
        json.dump(result, f)


def freqs(out):
    cases = {
        # DeepSeek-V3's YaRN (the defaults) at twice the original context.
        "v3": DeepSeekV3ModelArgs(max_seq_len=8192),
        # A small one: 16 rope dims, original context 32, factor 4, 64 positions.
        "small": DeepSeekV3ModelArgs(max_seq_len=64, qk_rope_head_dim=16, original_seq_len=32, rope_factor=4.0,
                                     rope_theta=10000.0, beta_fast=32, beta_slow=1),
    }
    save_file({k: torch.view_as_real(precompute_freqs_cis(a)).contiguous() for k, a in cases.items()}, out)


if __name__ == "__main__":
    if sys.argv[1] == "counts":
        counts(sys.argv[2], int(sys.argv[3]))
    else:
        freqs(sys.argv[2])
