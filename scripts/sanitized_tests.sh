#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds titan with AddressSanitizer + UndefinedBehaviorSanitizer in build-asan and runs the test suite
# there (LeakSanitizer on, any report fatal). See docs/sanitizers.md.
#
#   scripts/sanitized_tests.sh [--build-only] [--quick] [extra ctest arguments, e.g. -R 'FSDP 2']
#
# --quick leaves out the slowest tests (each over about a minute in CI: loss curves, the 4-rank CP, PP and
# EP parity runs, elastic and replica restarts, the install and peers checks): about half an hour on 2
# cores instead of about an hour for the whole suite.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build_only=0
quick=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-only) build_only=1; shift ;;
    --quick) quick=1; shift ;;
    *) extra+=("$1"); shift ;;
  esac
done

python=${Python3_EXECUTABLE:-$HOME/.cache/titan/venv/bin/python}
if [[ ! -f build-asan/CMakeCache.txt ]]; then
  # -O1 with line tables: about half the compile time of -O2 -g on 2 cores, and reports still name lines.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTITAN_SANITIZE=address,undefined \
    -DTITAN_ENABLE_CUDA=OFF -DPython3_EXECUTABLE="$python"
fi
# Every program a test starts, not only the test binary: titan_tests depends on each (tests/CMakeLists.txt), and
# the check fails here, naming the program and the test, when a test starts one that list lacks.
ninja -C build-asan build.ninja >/dev/null  # regenerated first when a CMakeLists.txt changed
if ! list=$("$python" scripts/check_test_programs.py --root . --build build-asan --print); then
  printf '%s\n' "$list" >&2
  exit 1
fi
mapfile -t programs <<<"$list"
nice -n 19 ninja -C build-asan -j2 "${programs[@]}"
[[ $build_only == 1 ]] && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Sanitized code runs a few times slower: the tests' waits and timing slack scale by this (tests/test_util.hpp).
export TITAN_TEST_TIME_SCALE=${TITAN_TEST_TIME_SCALE:-3}
args=(--test-dir build-asan --output-on-failure -j2 --timeout 1200)
if [[ $quick == 1 ]]; then
  # By name, as ctest lists them.
  args+=(-E 'curve|peers smoke|install:|elastic|zero-bubble|4-D|CP 4 |CP 2 x PP 2|CP 2 matches|train deepseek_v3 with expert|Interleaved 1F1B|pp 4 match|replica fault|Hang: with|bf16 params and fp32 reduce|AC under')
fi
log=build-asan/sanitized_tests.log
status=0
ctest "${args[@]}" "${extra[@]}" 2>&1 | tee "$log" || status=$?
# A rank that a test expects to fail exits non-zero either way: look for the reports themselves too.
if grep -q -E 'ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:' "$log"; then
  echo "sanitized_tests.sh: sanitizer reports in $log" >&2
  exit 1
fi
exit "$status"
