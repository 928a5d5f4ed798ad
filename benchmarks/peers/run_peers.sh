#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# titan vs torchtitan's Llama 3 with FSDP2 and vs plain PyTorch eager, alternately in one run (after
# scripts/setup.sh, which builds bench_step_throughput and titan-run and installs the pinned torchtitan).
#   benchmarks/peers/run_peers.sh [compare.py flags: --configs ... --ranks 1,2 --rounds N --smoke]
# Prints every run and the table of docs/performance.md; writes build/peers/result.json.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-${TITAN_HOME:-$HOME/.cache/titan}/venv/bin/python}"
exec "$PY" "$ROOT/benchmarks/peers/compare.py" --build "${BUILD_DIR:-$ROOT/build}" --python "$PY" "$@"
