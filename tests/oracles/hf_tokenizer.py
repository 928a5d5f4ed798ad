# SPDX-License-Identifier: BSD-3-Clause
"""Hugging Face `tokenizers` as the oracle for titan's byte-level BPE (tests/data/bpe_tokenizer_test.cpp).

  encode <tokenizer.json> <text> <out_prefix>   ids of the text (int32 LE) + HF's decode of them
  train  <text> <vocab_size> <out_dir>          HF-trained GPT-2 style BPE (legacy "a b" merges)
  llama3 <text> <vocab_size> <out_dir>          HF-trained BPE with Llama 3's Split regex, ignore_merges,
                                                BOS added by a TemplateProcessing post-processor

`train` and `llama3` write tokenizer.json + tokenizer_config.json, then encode like `encode` does.
As torchtitan's HuggingFaceTokenizer does, the special tokens named in a tokenizer_config.json beside
the tokenizer.json are registered before encoding.
"""
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]


def read_text(path):
    with open(path, "r", encoding="utf-8", newline="") as f:
        return f.read()


def load(path):
    tok = Tokenizer.from_file(path)
    config_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if os.path.exists(config_path):
        with open(config_path) as f:
            config = json.load(f)
        specials = []
        for key in ["bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"]:
            value = config.get(key)
            if isinstance(value, dict):
                value = value["content"]
            if value is not None:
                specials.append(AddedToken(value, special=True))
        for entry in config.get("added_tokens_decoder", {}).values():
            specials.append(AddedToken(entry["content"], special=entry.get("special", True),
                                       normalized=entry.get("normalized", True), lstrip=entry.get("lstrip", False),
                                       rstrip=entry.get("rstrip", False), single_word=entry.get("single_word", False)))
        tok.add_special_tokens(specials)
    return tok


def encode(tokenizer_path, text_path, out_prefix):
    tok = load(tokenizer_path)
    ids = tok.encode(read_text(text_path)).ids
    with open(out_prefix + ".ids", "wb") as f:
        f.write(b"".join(int(i).to_bytes(4, "little", signed=True) for i in ids))
    with open(out_prefix + ".decoded", "w", encoding="utf-8", newline="") as f:
        f.write(tok.decode(ids, skip_special_tokens=False))


def write_config(out_dir):
    config = {"bos_token": SPECIALS[0], "eos_token": {"content": SPECIALS[1]}, "pad_token": SPECIALS[2]}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def train(text_path, vocab_size, out_dir, llama3):
    tok = Tokenizer(models.BPE())
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        # add_prefix_space exercises the per-segment prefix (segments are cut by special tokens).
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([text_path], trainer)
    if llama3:
        bos = tok.token_to_id(SPECIALS[0])
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{SPECIALS[0]} $A", special_tokens=[(SPECIALS[0], bos)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    with open(path) as f:
        doc = json.load(f)
    if llama3:
        doc["model"]["ignore_merges"] = True
    else:
        doc["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in doc["model"]["merges"]]
    with open(path, "w") as f:
        json.dump(doc, f, ensure_ascii=False)
    write_config(out_dir)
    encode(path, text_path, os.path.join(out_dir, "hf"))


def main(argv):
    mode = argv[1]
    if mode == "encode":
        encode(argv[2], argv[3], argv[4])
    elif mode in ("train", "llama3"):
        train(argv[2], int(argv[3]), argv[4], llama3=mode == "llama3")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv)
