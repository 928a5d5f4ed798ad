# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: Hugging Face transformers' LlamaForCausalLM for the checkpoint tests (fp32, eager attention).

  hf_llama.py make DIR OUT [--tied] [--sharded] [-- DIR OUT [--tied] [--sharded] ...]
                                                  a small random Llama saved to DIR by save_pretrained;
                                                  OUT (safetensors) gets fixed tokens and its logits; each
                                                  group after a -- makes one more, in the same process
  hf_llama.py logits DIR TOKENS OUT               logits of the model in DIR on TOKENS' "tokens"
"""
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits.float().contiguous()


def make(folder, out, tied, sharded):
    torch.manual_seed(1234)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
                         attn_implementation="eager")
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():  # norms away from 1 and larger weights, so every tensor's layout matters
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.08) + (1.0 if p.dim() == 1 else 0.0))
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="40KB" if sharded else "5GB")
    tokens = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    save_file({"tokens": tokens, "logits": logits_of(model, tokens)}, out)


def logits(folder, tokens_file, out):
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    tokens = load_file(tokens_file)["tokens"]
    save_file({"logits": logits_of(model, tokens)}, out)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        groups = [[]]
        for word in sys.argv[2:]:
            if word == "--":
                groups.append([])
            else:
                groups[-1].append(word)
        for group in groups:
            make(group[0], group[1], "--tied" in group, "--sharded" in group)
    else:
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
