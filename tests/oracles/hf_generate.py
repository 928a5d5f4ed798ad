# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: Hugging Face transformers' greedy generate() for the generation tests (fp32, eager attention).

  hf_generate.py DIR PROMPTS OUT   for each JSON line of PROMPTS (titan-generate --output jsonl: prompt_ids,
                                   ids, eos_id), AutoModelForCausalLM.from_pretrained(DIR).generate(do_sample=False)
                                   on the prompt alone, as many new tokens as titan was asked for (OUT's
                                   max_new_tokens), stopping at eos_id (none when -1); OUT gets one JSON list of
                                   the new ids per prompt.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, GenerationConfig


def main(folder, prompts_file, out, max_new_tokens):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    # The prompt rows say when to stop; a saved generation_config.json's eos must not add a stop of its own.
    model.generation_config.eos_token_id = None
    results = []
    with open(prompts_file) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for row in rows:
        eos = row["eos_id"] if row["eos_id"] >= 0 else None
        config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                                  pad_token_id=eos if eos is not None else 0)
        ids = torch.tensor([row["prompt_ids"]], dtype=torch.long)
        with torch.no_grad():
            generated = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        results.append(generated[0, ids.shape[1]:].tolist())
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
