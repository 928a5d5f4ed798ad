#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs a command for a ctest, shows its output, and passes only when the command exits 0 AND printed
# each expected text (a ctest PASS_REGULAR_EXPRESSION alone would ignore the exit status).
#   tests/scripts/expect_output.sh [--contains TEXT]... [--line TEXT]... [--lines N TEXT]... [--next TEXT]...
#                                  -- command args...
#     --contains TEXT   some line contains TEXT (fixed string)
#     --line TEXT       some line is exactly TEXT
#     --lines N TEXT    exactly N lines contain TEXT
#     --next TEXT       the line the previous --next matched, or a later one, contains TEXT (the --next
#                       texts appear in the order given)
set -uo pipefail
checks=()
order=()
while (($#)) && [[ "$1" != "--" ]]; do
  case "$1" in
    --contains|--line) checks+=("$1" "-" "$2"); shift 2 ;;
    --lines) checks+=("$1" "$2" "$3"); shift 3 ;;
    --next) order+=("$2"); shift 2 ;;
    *) echo "[expect_output] unknown option $1" >&2; exit 2 ;;
  esac
done
[[ "${1:-}" == "--" ]] || { echo "[expect_output] expected -- before the command" >&2; exit 2; }
shift
out="$("$@" 2>&1)"
rc=$?
printf '%s\n' "$out"
if ((rc != 0)); then
  echo "[expect_output] expected exit status 0, got $rc from: $*" >&2
  exit 1
fi
failed=0
for ((i = 0; i < ${#checks[@]}; i += 3)); do
  kind="${checks[i]}" n="${checks[i + 1]}" text="${checks[i + 2]}"
  case "$kind" in
    --contains) grep -qF -- "$text" <<<"$out" || { echo "[expect_output] expected a line containing: $text" >&2; failed=1; } ;;
    --line) grep -qxF -- "$text" <<<"$out" || { echo "[expect_output] expected the line: $text" >&2; failed=1; } ;;
    --lines)
      got="$(grep -cF -- "$text" <<<"$out")"
      ((got == n)) || { echo "[expect_output] expected $n lines containing '$text', got $got" >&2; failed=1; } ;;
  esac
done
next=0
while IFS= read -r line && ((next < ${#order[@]})); do
  while ((next < ${#order[@]})) && [[ "$line" == *"${order[next]}"* ]]; do next=$((next + 1)); done
done <<<"$out"
if ((next < ${#order[@]})); then
  after="the start"; ((next > 0)) && after="the line containing '${order[next - 1]}'"
  echo "[expect_output] expected, after $after, a line containing: ${order[next]}" >&2
  failed=1
fi
exit "$failed"
