#!/usr/bin/env bash
# Checks that titan's C++ sources match .clang-format (ctest runs this); --fix rewrites them in place.
#   scripts/check_format.sh                  # check every source
#   scripts/check_format.sh --fix            # format every source
#   scripts/check_format.sh --fix FILE...    # format only these (paths from the repository root)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fix=0
if [[ "${1:-}" == "--fix" ]]; then
  fix=1
  shift
fi
if (($# > 0)); then
  files=("$@")
  for f in "${files[@]}"; do
    [[ -f "$f" ]] || { echo "check_format.sh: expected a file under the repository root, got '$f'" >&2; exit 2; }
  done
else
  mapfile -t files < <(find include src tests examples benchmarks tools \
    \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.h' \) -type f | sort)
fi
if ((fix)); then
  clang-format -i "${files[@]}"
  echo "formatted ${#files[@]} files"
  exit 0
fi
clang-format --dry-run --Werror "${files[@]}"
echo "format ok: ${#files[@]} files match .clang-format ($(clang-format --version | head -1))"
