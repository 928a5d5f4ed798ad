# SPDX-License-Identifier: BSD-3-Clause
"""Builds the tests' tokenizer with Hugging Face `tokenizers`: a byte-level BPE trained on tinyshakespeare.

  make_tokenizer.py <text> <out_dir>

Writes <out_dir>/tokenizer.json and <out_dir>/tokenizer_config.json. The build runs it (tests/CMakeLists.txt)
into build/tests/assets/tokenizer, the folder the tests, the trainer tests and the resume tests load.

The layout is the one of the small tokenizer torchtitan's tests use, with real merges: GPT-2's byte-level
pre-tokenizer and decoder (no prefix space), 2,040 BPE entries (the 256 byte symbols and 1,784 merges), then
8 special tokens, so the vocab is 2,048, the debug model's. BOS is <|begin_of_text|> (2040), EOS
<|end_of_text|> (2041). The output is a pure function of the text and the pinned `tokenizers` version:
two runs give the same bytes.
"""
import json
import os
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BPE_SIZE = 2040
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|endoftext|>", "<|reserved_special_token_0|>"]


def build(text_path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_SIZE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    with open(text_path, "r", encoding="utf-8", newline="") as f:
        text = f.read()
    # One document per blank-line-separated speech, as titan's text corpus reads the file.
    tok.train_from_iterator(text.split("\n\n"), trainer)
    assert tok.get_vocab_size() == BPE_SIZE, tok.get_vocab_size()
    # Added after training, so the specials follow the BPE entries (ids 2040..2047).
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tok


def config_json(tok):
    decoder = {}
    for s in SPECIALS:
        decoder[str(tok.token_to_id(s))] = {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": True}
    return {"added_tokens_decoder": decoder, "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
            "pad_token": SPECIALS[2], "clean_up_tokenization_spaces": False, "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast"}


def write_atomic(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__)
    text_path, out_dir = argv[1], argv[2]
    tok = build(text_path)
    os.makedirs(out_dir, exist_ok=True)
    # HF writes the vocab in id order; re-serialised with fixed settings so the bytes never vary.
    doc = json.loads(tok.to_str())
    write_atomic(os.path.join(out_dir, "tokenizer.json"), json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    write_atomic(os.path.join(out_dir, "tokenizer_config.json"), json.dumps(config_json(tok), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv)
