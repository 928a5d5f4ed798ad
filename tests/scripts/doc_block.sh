#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs the ```sh block that follows the line `<!-- NAME -->` in a doc, as written, from the repository root,
# so a walkthrough the docs show is one the tests ran. The caller's environment reaches the block (a test
# points its folders at a temporary one); the block fails on its first failing command.
#   tests/scripts/doc_block.sh [--fresh DIR] DOC NAME
#     --fresh DIR   remove DIR first (the folder the block writes, so a rerun starts as the first run did)
set -euo pipefail
if [[ "${1:-}" == "--fresh" ]]; then
  rm -rf -- "$2"
  shift 2
fi
doc="$1" name="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
block="$(awk -v marker="<!-- $name -->" '
  $0 == marker { armed = 1; next }
  armed && /^```sh$/ { inside = 1; next }
  inside && /^```$/ { exit }
  inside { print }' "$root/$doc")"
[[ -n "$block" ]] || { echo "[doc_block] expected a \`\`\`sh block after '<!-- $name -->' in $doc, got none" >&2; exit 2; }
cd "$root"
bash -euo pipefail -c "$block"
