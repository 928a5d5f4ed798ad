# SPDX-License-Identifier: BSD-3-Clause
"""Oracle for titan's Qwen3 tests: torchtitan 0.2.2's Qwen3 flavors and transformers' Qwen3 /
Qwen3-MoE (fp32, eager attention).

  qwen3_oracle.py counts OUT SEQ             per torchtitan flavor, built on the meta device: the
                                             unique parameter count and get_nparams_and_flops(SEQ)
                                             as JSON {flavor: {params, nparams, flops}}
  qwen3_oracle.py make DIR OUT [--moe] [--tied]
                                             a small random Qwen3 (or Qwen3-MoE with a dense layer
                                             among the sparse ones) saved to DIR by save_pretrained;
                                             OUT (safetensors) gets fixed tokens and their logits
  qwen3_oracle.py loss DIR TOKENS OUT        logits of the model in DIR on TOKENS' "tokens" (B, S+1)
                                             minus the last column, and the mean next-token
                                             cross-entropy ("loss")
"""
import json
import sys

import torch


def counts(out, seq_len):
    from torchtitan.models.qwen3 import qwen3_args
    from torchtitan.models.qwen3.model.model import Qwen3Model

    result = {}
    for name, args in qwen3_args.items():
        with torch.device("meta"):
            model = Qwen3Model(args)
        params = sum(p.numel() for p in model.parameters())  # tied weights once
        nparams, flops = args.get_nparams_and_flops(model, seq_len)
        result[name] = {"params": params, "nparams": nparams, "flops": flops}
    with open(out, "w") as f:
        json.dump(result, f)


def make(folder, out, moe, tied):
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(1234)
    # head_dim * heads != hidden_size, as in every Qwen3 flavor.
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24, max_position_embeddings=256, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=tied, attn_implementation="eager")
    if moe:
        config = Qwen3MoeConfig(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
                                decoder_sparse_step=1, mlp_only_layers=[1], **common)
        model = Qwen3MoeForCausalLM(config)
    else:
        config = Qwen3Config(**common)
        model = Qwen3ForCausalLM(config)
    model = model.float().eval()
    with torch.no_grad():  # norms away from 1 and larger weights, so every tensor's layout matters
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.08) + (1.0 if p.dim() == 1 else 0.0))
    model.save_pretrained(folder, safe_serialization=True)
    tokens = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().contiguous()
    save_file({"tokens": tokens, "logits": logits}, out)


def loss(folder, tokens_file, out):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = load_file(tokens_file)["tokens"]
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1]).logits.float()
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    save_file({"logits": logits.contiguous(), "loss": ce.reshape(1)}, out)


if __name__ == "__main__":
    if sys.argv[1] == "counts":
        counts(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], "--moe" in sys.argv, "--tied" in sys.argv)
    else:
        loss(sys.argv[2], sys.argv[3], sys.argv[4])
