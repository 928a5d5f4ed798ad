#!/usr/bin/env bash
# titan's activation checkpointing beside torchtitan's apply_ac in one run, same blocks, shape and threads:
#   benchmarks/run_activation_checkpoint.sh [--dim 512 --seq 2048 --batch 4 --iters 3]   (after scripts/setup.sh)
# Prints titan's table (bench_activation_checkpoint, with the analytic bound for full AC), then the peer's
# (benchmarks/peers/ac_peer.py: torchtitan's Llama 3 blocks wrapped by torchtitan's apply_ac).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-${TITAN_HOME:-$HOME/.cache/titan}/venv/bin/python}"
BIN="${BUILD_DIR:-$ROOT/build}/bin/bench_activation_checkpoint"
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--dim 512 --seq 2048 --batch 4 --iters 3)
echo "== $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
"$BIN" "${ARGS[@]}"
"$PY" "$ROOT/benchmarks/peers/ac_peer.py" "${ARGS[@]}" 2> >(grep -v "gpuGetDeviceCount\|Profiler clears\|_warn_once" >&2)
