#!/usr/bin/env bash
# Checks that titan's C++ sources match .clang-format (ctest runs this); --fix rewrites them in place.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mapfile -t files < <(find include src tests examples benchmarks tools \
  \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' -o -name '*.h' \) -type f | sort)
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
  echo "formatted ${#files[@]} files"
  exit 0
fi
clang-format --dry-run --Werror "${files[@]}"
echo "format ok: ${#files[@]} files match .clang-format ($(clang-format --version | head -1))"
