#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs the process-level tests (titan-run, torchrun, hangs, restarts, preemption, elastic, replica groups)
# N times in a row while a busy loop loads one core, and prints how many of the N runs each test failed.
# Exits 1 when any run of any test failed. See docs/testing.md ("Flakiness check").
#
#   scripts/flaky_check.sh [N=10] [ctest -R regex]
#   nice scripts/flaky_check.sh 2 '^Hang'        # on a shared machine: the tests and the load both niced
#
# The tests' waits can be scaled for a slow machine with TITAN_TEST_TIME_SCALE (tests/test_util.hpp); the
# check is meant to run without it, so that a test that needs it shows up.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
n=${1:-10}
regex=${2:-'^(titan-run|torchrun|Hang|restart|preemption|elastic|replica|a rank killed)'}
build=${TITAN_BUILD_DIR:-build}
if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
  echo "[flaky_check] expected N, the number of runs (>= 1), got '$n'. Usage: scripts/flaky_check.sh [N] [regex]" >&2
  exit 2
fi
if [[ ! -x $build/bin/titan_tests ]]; then
  echo "[flaky_check] expected a build in $build (bin/titan_tests), got none. Build first, or set TITAN_BUILD_DIR." >&2
  exit 2
fi
count=$(ctest --test-dir "$build" -N -R "$regex" | sed -n 's/^Total Tests: //p')
if [[ ${count:-0} == 0 ]]; then
  echo "[flaky_check] expected tests matching '$regex', got none. List them with: ctest --test-dir $build -N" >&2
  exit 2
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/titan-flaky.XXXXXX")
# The load: one core busy at this script's own priority (not niced below the tests it competes with). The
# trap stops it however the script ends (a failure, Ctrl-C, the end).
yes > /dev/null &
load=$!
stop_load() {
  local status=$?
  kill "$load" 2> /dev/null || true
  wait "$load" 2> /dev/null || true
  exit "$status"
}
trap stop_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "flaky_check: $count tests matching '$regex', $n runs, one core loaded (pid $load); logs in $logs"
start=$SECONDS
for ((i = 1; i <= n; i++)); do
  round=$SECONDS
  # One test at a time: the load, not the tests themselves, is what competes for the CPU.
  ctest --test-dir "$build" -R "$regex" -j1 --timeout 1200 --output-on-failure \
    --output-junit "$logs/run-$i.xml" > "$logs/run-$i.log" 2>&1 || true
  echo "flaky_check: run $i of $n took $((SECONDS - round)) s ($(grep -c -E '\*\*\*(Failed|Timeout|Exception|Not Run)' "$logs/run-$i.log" || true) failed)"
done
echo "flaky_check: $n runs took $((SECONDS - start)) s"

# Per test: failed runs of N, from ctest's JUnit files (a run the test is missing from counts as failed).
python3 - "$logs" "$n" <<'EOF'
import sys, xml.etree.ElementTree as ET
from pathlib import Path

logs, n = Path(sys.argv[1]), int(sys.argv[2])
failed, seen = {}, {}
for i in range(1, n + 1):
    path = logs / f"run-{i}.xml"
    if not path.exists():
        print(f"flaky_check: run {i} wrote no {path.name}; see {logs}/run-{i}.log")
        continue
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name")
        seen[name] = seen.get(name, 0) + 1
        bad = case.get("status") not in ("run", "success") or case.find("failure") is not None
        failed[name] = failed.get(name, 0) + (1 if bad else 0)
failed = {k: failed[k] + n - seen[k] for k in seen}
width = len(str(n))
for name in sorted(seen, key=lambda k: (-failed[k], k)):
    print(f"{failed[name]:>{width}}/{n} failed  {name}")
bad = sum(1 for k in seen if failed[k])
print(f"flaky_check: {bad} of {len(seen)} tests failed at least once" if bad else
      f"flaky_check: every one of {len(seen)} tests passed {n} of {n} runs")
sys.exit(1 if bad or not seen else 0)
EOF
