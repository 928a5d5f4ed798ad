# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: Hugging Face PEFT loads titan's LoRA adapter onto transformers' model of the base (fp32, eager attention).

  peft_lora.py logits BASE ADAPTER TOKENS OUT [MERGED]
      BASE: an HF model folder (titan-convert to-hf of the frozen base); ADAPTER: a PEFT folder (titan-convert
      to-peft, or the Trainer's final save). Every tensor of ADAPTER must load onto a LoRA module PEFT made from its
      adapter_config.json, and every LoRA module must get one (exit 1 naming them otherwise). OUT (safetensors) gets
      the adapted model's logits on TOKENS' "tokens" and the base model's ("base_logits"); with MERGED (an HF
      folder of the merged model, titan-convert to-hf) also transformers' logits of that model ("merged_logits"),
      in the same process, so that the test starts Python and imports transformers once. "tokenizer_ids" holds the
      ids AutoTokenizer, loaded from ADAPTER alone, gives SAMPLE_TEXT (no special tokens).
"""
import sys

import torch
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

SAMPLE_TEXT = "To be, or not to be: that is the question."


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits.float().contiguous()


def load_hf(folder):
    return AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()


def logits(base_dir, adapter_dir, tokens_file, out, merged_dir=None):
    tokens = load_file(tokens_file)["tokens"]
    results = {"merged_logits": logits_of(load_hf(merged_dir), tokens)} if merged_dir else {}
    base = load_hf(base_dir)
    base_logits = logits_of(base, tokens)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    saved = load_file(f"{adapter_dir}/adapter_model.safetensors")
    # The adapters alone: with lm_head targeted PEFT would also list the head's own weight.
    loaded = get_peft_model_state_dict(model, save_embedding_layers=False)
    missing = sorted(set(saved) ^ set(loaded))
    if missing:
        print(f"peft_lora.py: adapter keys that did not meet a LoRA module: {missing}", file=sys.stderr)
        sys.exit(1)
    for key, value in saved.items():
        if not torch.equal(loaded[key].float(), value.float()):
            print(f"peft_lora.py: {key} loaded with other values than {adapter_dir} holds", file=sys.stderr)
            sys.exit(1)
    ids = AutoTokenizer.from_pretrained(adapter_dir)(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    results["tokenizer_ids"] = torch.tensor(ids, dtype=torch.int64)
    save_file({"logits": logits_of(model, tokens), "base_logits": base_logits, **results}, out)


if __name__ == "__main__":
    if sys.argv[1] != "logits" or len(sys.argv) not in (6, 7):
        sys.exit(f"usage: {__doc__}")
    logits(*sys.argv[2:])
