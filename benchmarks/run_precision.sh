#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# fp32 vs bf16 vs float8 (tensorwise) step throughput on this CPU, titan vs torchtitan's Llama 3 side by side:
# one rank under autocast (torchtitan: torch.autocast("cpu", torch.bfloat16)) and two ranks under FSDP
# (torchtitan: FSDP2's MixedPrecisionPolicy(bf16, fp32); titan: the same param/reduce dtypes, the same
# reshard rule), for the debug model and the ~100M flavor at S = 128 (bf16 GEMMs are 40-140x slower than
# fp32 on CPUs without AVX512-BF16/AMX, so larger shapes take minutes per bf16 step). After scripts/setup.sh:
#   benchmarks/run_precision.sh                 # ~15 minutes on 2 cores; prints the docs/performance.md table
# One compare.py invocation per (model, ranks), each wrapped in `flock $TITAN_BENCH_LOCK` when that is set
# (a shared machine's build lock: no compile runs during a timed invocation); the table comes last.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-${TITAN_HOME:-$HOME/.cache/titan}/venv/bin/python}"
WORK="${WORK:-$(mktemp -d -t titan-precision-XXXXXXXX)}"
LOCK=()
[[ -n "${TITAN_BENCH_LOCK:-}" ]] && LOCK=(flock "$TITAN_BENCH_LOCK")
COMPARE=("$PY" "$ROOT/benchmarks/peers/compare.py" --build "${BUILD_DIR:-$ROOT/build}" --python "$PY"
         --precisions "${PRECISIONS:-fp32,bf16,float8}" --sides titan,torchtitan --rounds "${ROUNDS:-1}")
for config in ${CONFIGS:-debugmodel-128 100M-128}; do
  for ranks in 1 2; do
    uptime
    "${LOCK[@]}" "${COMPARE[@]}" --configs "$config" --ranks "$ranks" --work "$WORK" --json "$WORK/$config-$ranks.json"
  done
done
uptime
"${COMPARE[@]}" --configs "$(echo ${CONFIGS:-debugmodel-128 100M-128} | tr ' ' ',')" --summarise "$WORK" \
  --json "$WORK/result.json"
