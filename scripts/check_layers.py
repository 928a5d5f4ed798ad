#!/usr/bin/env python3
"""Checks that titan's folders form layers: every #include goes to the same folder or a lower one.

The order is written once, in docs/architecture.md (the fenced block under "## Layers": one layer per
line, lowest first, its first word the folder). A file's folder is its first directory under
include/titan/ or src/ (include/titan/titan.hpp is the umbrella, above everything). Relative includes
("../layout/binding.hpp", "tp_styles.hpp") resolve against the including file. Exit 1 lists every
upward edge with the file and line that makes it.

  scripts/check_layers.py                      check the repository
  scripts/check_layers.py --inject core/error.hpp=titan/train/trainer.hpp --expect "core -> train"
                                               add a synthetic include and require that it is caught
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_order(root):
    text = open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8").read()
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    order = [line.split()[0] for line in block.splitlines()[1:] if line.strip()]
    return {name: rank for rank, name in enumerate(order)}


def folder_of(root, path):
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    for prefix in ("include/titan/", "src/"):
        if rel.startswith(prefix):
            rest = rel[len(prefix):]
            return rest.split("/", 1)[0] if "/" in rest else "umbrella"
    return None


def resolve(root, including, target):
    if target.startswith("titan/"):
        return os.path.join(root, "include", target)
    candidate = os.path.normpath(os.path.join(os.path.dirname(including), target))
    return candidate if os.path.exists(candidate) else None


def edges(root, injected):
    for base in ("include/titan", "src"):
        for dirpath, _, files in os.walk(os.path.join(root, base)):
            for name in sorted(files):
                if not name.endswith((".hpp", ".cpp", ".inc", ".cu", ".h")):
                    continue
                path = os.path.join(dirpath, name)
                lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                for key, target in injected:
                    if rel.endswith(key):
                        lines.append(f'#include "{target}"  // injected')
                for number, line in enumerate(lines, 1):
                    match = INCLUDE.match(line)
                    if not match:
                        continue
                    target = resolve(root, path, match.group(1))
                    if target is None:
                        continue
                    yield rel, number, folder_of(root, path), folder_of(root, target), match.group(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--inject", action="append", default=[], metavar="FILE=INCLUDE",
                        help="pretend FILE (a path suffix) also includes INCLUDE")
    parser.add_argument("--expect", help="succeed only if the check fails and reports this edge, e.g. 'core -> train'")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    order = layer_order(root)
    injected = [tuple(item.split("=", 1)) for item in args.inject]

    violations, unknown = [], set()
    for rel, number, source, target, written in edges(root, injected):
        if source is None or target is None or source == target:
            continue
        for folder in (source, target):
            if folder not in order:
                unknown.add(folder)
        if source in order and target in order and order[target] > order[source]:
            violations.append(f"{source} -> {target}: {rel}:{number} includes \"{written}\"")
    for folder in sorted(unknown):
        violations.append(f"{folder}: a folder the layer order in docs/architecture.md does not list; add it there")

    report = "\n".join(violations)
    if args.expect is not None:
        if args.expect in report:
            print(f"caught as expected:\n{report}")
            return 0
        print(f"expected a reported edge '{args.expect}', got:\n{report or '(no violation)'}")
        return 1
    if violations:
        print("[titan::layers] expected every include to point to the same or a lower layer "
              "(docs/architecture.md, ## Layers), got:\n" + report +
              "\nMove the shared piece down a layer, or reach the upper layer through an interface the lower one declares.")
        return 1
    print(f"layers ok: {len(order)} layers, no upward include")
    return 0


if __name__ == "__main__":
    sys.exit(main())
