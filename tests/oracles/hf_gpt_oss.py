# SPDX-License-Identifier: BSD-3-Clause
"""Oracle for titan's gpt-oss tests: torchtitan's gpt-oss flavors and transformers' GptOssForCausalLM
(fp32, eager attention).

  hf_gpt_oss.py counts OUT SEQ       torchtitan's 20b and 120b built on the meta device: parameter count and
                                     get_nparams_and_flops(SEQ); transformers' parameter count of the same
                                     shapes; every torchtitan and HF parameter name of 20b with its shape.
                                     JSON {flavors: {name: {params, flops, hf_params}}, torchtitan: {..}, hf: {..}}
  hf_gpt_oss.py make DIR OUT         a small random gpt-oss (sliding and full blocks, non-zero sinks and
                                     biases, a clamp that bites) saved to DIR by save_pretrained; OUT
                                     (safetensors) gets tokens longer than the window and their logits
  hf_gpt_oss.py logits DIR TOKENS OUT  logits of the model in DIR on TOKENS' "tokens" (B, S)
"""
import json
import sys

import torch


def counts(out, seq_len):
    from torchtitan.models.gpt_oss import gptoss_configs
    from torchtitan.models.gpt_oss.model.model import GptOssModel
    from transformers import GptOssConfig, GptOssForCausalLM

    result = {"flavors": {}}
    for name in ("20b", "120b"):
        args = gptoss_configs[name]
        with torch.device("meta"):
            model = GptOssModel(args)
            hf = GptOssForCausalLM(GptOssConfig(num_hidden_layers=args.n_layers,
                                                num_local_experts=args.moe_args.num_experts))
        _, flops = args.get_nparams_and_flops(model, seq_len)
        result["flavors"][name] = {"params": sum(p.numel() for p in model.parameters()), "flops": flops,
                                   "hf_params": sum(p.numel() for p in hf.parameters())}
        if name == "20b":
            result["torchtitan"] = {k: list(p.shape) for k, p in model.named_parameters()}
            result["hf"] = {k: list(p.shape) for k, p in hf.named_parameters()}
    with open(out, "w") as f:
        json.dump(result, f)


def make(folder, out):
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(1234)
    # Blocks 0 and 2 slide over 5 tokens, block 1 sees all 20; YaRN with gpt-oss's constants, whose ramp
    # ends fall between pairs at head_dim 16; a clamp of 1 that many gate and up values exceed.
    config = GptOssConfig(vocab_size=96, hidden_size=64, intermediate_size=24, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                          num_local_experts=6, num_experts_per_tok=3, swiglu_limit=1.0, max_position_embeddings=131072,
                          rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="eager")
    model = GptOssForCausalLM(config).float().eval()
    with torch.no_grad():  # norms away from 1, sinks and biases away from 0, weights large enough to route apart
        for name, p in model.named_parameters():
            if "layernorm" in name or name == "model.norm.weight":
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif p.dim() == 1 or name.endswith("_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    tokens = torch.randint(0, config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().contiguous()
    save_file({"tokens": tokens, "logits": logits}, out)


def logits(folder, tokens_file, out):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = load_file(tokens_file)["tokens"]
    with torch.no_grad():
        result = model(input_ids=tokens).logits.float().contiguous()
    save_file({"logits": result}, out)


if __name__ == "__main__":
    if sys.argv[1] == "counts":
        counts(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    else:
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
