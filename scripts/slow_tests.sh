#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The slow tier, for a scheduled CI job rather than every change (docs/testing.md):
#   - `ctest -L slow`: every precision mode's whole 200-step curve against docs/assets/precision_curves.csv,
#     and bf16 optimizer states beside fp32 states over 200 steps; Slurm's requeue and node-failure scenarios;
#     the peers harness's smoke run; the GPU carry's packing;
#   - the fuzz tests at 10x (10,000 corrupted safetensors files and checkpoints each);
#   - with --sanitizers, the suite under ASan + UBSan (scripts/sanitized_tests.sh --quick; about 2 hours on
#     2 cores with its build).
#
#   scripts/slow_tests.sh [--sanitizers]      # after scripts/setup.sh; exits non-zero if anything failed
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
sanitizers=0
[[ "${1:-}" == "--sanitizers" ]] && sanitizers=1
status=0
ctest --test-dir build --output-on-failure -L slow --timeout 3600 || status=1
TITAN_FUZZ_TRIALS=10000 ctest --test-dir build --output-on-failure -R "corrupted" --timeout 3600 || status=1
if [[ $sanitizers == 1 ]]; then
  scripts/sanitized_tests.sh --quick || status=1
fi
exit $status
