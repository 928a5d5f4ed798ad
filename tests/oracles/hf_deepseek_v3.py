# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: Hugging Face transformers' DeepseekV3ForCausalLM for the DeepSeek-V3 HF tests (fp32, eager).

  hf_deepseek_v3.py make DIR OUT [--q-lora] [--half-rope] [--no-yarn]
      a small random DeepSeek-V3 (3 layers, the first dense; 8 routed experts in 2 groups, top 2, one
      shared expert; MLA with v_head_dim < qk head dim) saved to DIR by save_pretrained; --q-lora: the
      low-rank query path; --half-rope: rope_interleave false (rotate-half layout); --no-yarn: plain
      RoPE instead of YaRN (factor 4 over 8 original positions, mscale 1, mscale_all_dim 0.8). OUT
      (safetensors) gets fixed tokens and their logits.
  hf_deepseek_v3.py logits DIR TOKENS OUT   logits of the model in DIR on TOKENS' "tokens"
"""
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits.float().contiguous()


def make(folder, out, q_lora, half_rope, yarn):
    torch.manual_seed(1234)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if yarn:
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}
    config = DeepseekV3Config(
        vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
        n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, q_lora_rank=24 if q_lora else None, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=32, rms_norm_eps=1e-6,
        rope_interleave=not half_rope, rope_scaling=rope, tie_word_embeddings=False, attn_implementation="eager")
    model = DeepseekV3ForCausalLM(config).float().eval()
    with torch.no_grad():  # norms away from 1, larger weights, a routing bias: every tensor's layout matters
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.08) + (1.0 if p.dim() == 1 else 0.0))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.05)
    model.save_pretrained(folder, safe_serialization=True)
    tokens = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    save_file({"tokens": tokens, "logits": logits_of(model, tokens)}, out)


def logits(folder, tokens_file, out):
    model = DeepseekV3ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = load_file(tokens_file)["tokens"]
    save_file({"logits": logits_of(model, tokens)}, out)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], "--q-lora" in sys.argv, "--half-rope" in sys.argv, "--no-yarn" not in sys.argv)
    else:
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
