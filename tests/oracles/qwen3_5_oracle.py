# SPDX-License-Identifier: BSD-3-Clause
"""Oracle for titan's Qwen3.5 tests: transformers' Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (fp32, eager
attention, the torch reference of the gated delta rule).

  qwen3_5_oracle.py counts IN OUT           IN: JSON {flavor: config.json as titan exports it}; each model built
                                            by transformers from its config on the meta device; OUT: JSON
                                            {flavor: parameter count} (tied weights once)
  qwen3_5_oracle.py make DIR OUT [--moe] [--tied]
                                            a small random Qwen3.5 (or Qwen3.5-MoE) with linear and full attention
                                            blocks saved to DIR by save_pretrained; OUT (safetensors) gets fixed
                                            tokens, longer than one 64-token chunk, and their logits
  qwen3_5_oracle.py loss DIR TOKENS OUT     logits of the model in DIR on TOKENS' "tokens" (B, S+1) minus the last
                                            column, and the mean next-token cross-entropy ("loss")

The logits are the model's in fp64 ("logits", the function itself to ~1e-15) and in fp32 ("logits_fp32", what
transformers computes in fp32): their difference is the fp32 rounding error of the function on these inputs.
"""
import json
import sys

import torch


def model_class(config):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

    return Qwen3_5MoeForCausalLM if config.model_type == "qwen3_5_moe_text" else Qwen3_5ForCausalLM


def text_config(values):
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    values = {k: v for k, v in values.items() if k not in ("architectures", "torch_dtype", "dtype")}
    moe = values.pop("model_type") == "qwen3_5_moe_text"
    return Qwen3_5MoeTextConfig(**values) if moe else Qwen3_5TextConfig(**values)


def counts(configs_file, out):
    with open(configs_file) as f:
        configs = json.load(f)
    result = {}
    for name, values in configs.items():
        config = text_config(values)
        with torch.device("meta"):
            model = model_class(config)(config)
        result[name] = sum(p.numel() for p in model.parameters())  # tied weights once
    with open(out, "w") as f:
        json.dump(result, f)


def logits_both(model, tokens):
    """(fp64 logits, fp32 logits) of model (left in fp64) on tokens."""
    with torch.no_grad():
        fp32 = model.float()(input_ids=tokens, use_cache=False).logits.contiguous()
        fp64 = model.double()(input_ids=tokens, use_cache=False).logits.contiguous()
    return fp64, fp32


def make(folder, out, moe, tied):
    from safetensors.torch import save_file

    torch.manual_seed(1234)
    # Two Gated DeltaNet blocks with grouped value heads (2 key heads, 4 value heads) around a full-attention block
    # with head_dim * heads != hidden_size, and a last linear block: every kind of block and its neighbours.
    values = dict(vocab_size=96, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=24, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                  layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                  linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=12, linear_num_key_heads=2,
                  linear_num_value_heads=4,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    if moe:
        values.update(model_type="qwen3_5_moe_text", moe_intermediate_size=32, shared_expert_intermediate_size=48,
                      num_experts=8, num_experts_per_tok=3)
    else:
        values.update(model_type="qwen3_5_text", intermediate_size=96)
    config = text_config(values)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # a loop over experts: the grouped GEMM has no fp64
    model = model_class(config)(config).float().eval()
    with torch.no_grad():  # every tensor away from its init, so each one's layout matters
        for name, p in model.named_parameters():
            scale = 0.3 if p.dim() == 1 or name.endswith("conv1d.weight") else 0.08
            p.copy_(torch.randn_like(p) * scale)
    model.save_pretrained(folder, safe_serialization=True)
    tokens = torch.randint(0, config.vocab_size, (2, 70), generator=torch.Generator().manual_seed(5))
    logits, logits_fp32 = logits_both(model, tokens)
    save_file({"tokens": tokens, "logits": logits, "logits_fp32": logits_fp32}, out)


def loss(folder, tokens_file, out):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                 experts_implementation="eager").eval()
    tokens = load_file(tokens_file)["tokens"]
    logits, logits_fp32 = logits_both(model, tokens[:, :-1])
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    save_file({"logits": logits, "logits_fp32": logits_fp32, "loss": ce.reshape(1)}, out)


if __name__ == "__main__":
    if sys.argv[1] == "counts":
        counts(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], "--moe" in sys.argv, "--tied" in sys.argv)
    else:
        loss(sys.argv[2], sys.argv[3], sys.argv[4])
