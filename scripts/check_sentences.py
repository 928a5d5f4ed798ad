#!/usr/bin/env python3
"""Checks that no sentence of a Markdown file is longer than a limit (default 60 words): prose paragraphs, list
items and table cells, code blocks and inline code spans aside. Exit 1 names each long sentence with its line and
word count.

  scripts/check_sentences.py README.md                 check a file
  scripts/check_sentences.py README.md --inject-words 61
                                                       add a synthetic 61-word sentence and require that it is caught
"""
import argparse
import re
import sys

END = re.compile(r"(?<=[.!?;])\s+(?=[A-Z`*\[(\"])")


def chunks(lines):
    """(first line number, text) of each paragraph, list item and table cell outside code fences."""
    fence, buf, start = False, [], 0
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            if buf:
                yield start, " ".join(buf)
                buf = []
            continue
        if fence:
            continue
        stripped = line.strip()
        if stripped.startswith("|"):
            if buf:
                yield start, " ".join(buf)
                buf = []
            for cell in stripped.strip("|").split("|"):
                if not re.fullmatch(r"\s*:?-+:?\s*", cell):
                    yield number, cell
            continue
        if not stripped or stripped.startswith(("#", "- ", "* ")) or re.match(r"\d+\. ", stripped):
            if buf:
                yield start, " ".join(buf)
                buf = []
            if stripped.startswith("#") or not stripped:
                continue
        if not buf:
            start = number
        buf.append(stripped)
    if buf:
        yield start, " ".join(buf)


def long_sentences(text, limit):
    for line, chunk in chunks(text.splitlines()):
        prose = re.sub(r"`[^`]*`", "code", chunk)  # a code span is one word
        prose = re.sub(r"\]\([^)]*\)", "]", prose)  # a link's target is not words
        for sentence in END.split(prose):
            words = len(sentence.split())
            if words > limit:
                yield line, words, sentence


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--inject-words", type=int, default=0, help="append a synthetic sentence of this many words")
    args = parser.parse_args()
    found = 0
    for path in args.files:
        text = open(path, encoding="utf-8").read()
        if args.inject_words:
            text += "\n\n" + " ".join(["word"] * args.inject_words) + ".\n"
        for line, words, sentence in long_sentences(text, args.limit):
            found += 1
            print(f"{path}:{line}: a sentence of {words} words (limit {args.limit}): {sentence[:100]}...")
    if found:
        return 1
    print(f"no sentence over {args.limit} words in {', '.join(args.files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
