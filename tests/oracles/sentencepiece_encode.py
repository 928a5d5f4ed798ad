#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Oracle for the sentencepiece tokenizer test: the Python package's ids for a whole text file.
#   sentencepiece_encode.py MODEL TEXT_FILE OUT_IDS   (one id per line)
import sys

import sentencepiece as spm


def main() -> int:
    model, text_file, out = sys.argv[1:4]
    sp = spm.SentencePieceProcessor(model_file=model)
    with open(text_file, encoding="utf-8") as f:
        text = f.read()
    ids = sp.encode(text)
    with open(out, "w") as f:
        f.write("\n".join(str(i) for i in ids))
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
