#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# titan vs its Python peers on a machine with one NVIDIA GPU: builds bench_step_throughput against the
# torch found there, then runs, alternately, titan, torchtitan's Llama 3 (pip torchtitan, as pinned in
# scripts/requirements.txt) and the plain eager model on the Llama 3.2 1B shape (untied on every side),
# S = 2048, B = 4, bf16 autocast with fp32 master weights and AdamW, world size 1, 3 warm-up + 20 timed
# steps, 2 rounds. Prints tokens/s, MFU (torchtitan's 6N + 12*L*D*S against its peak table: 989 TFLOP/s
# for H100/H200 SXM) and peak allocated memory for each side. 8B is not run: its fp32 weights, grads and
# AdamW moments alone are 128 GB, beyond one GPU without sharding. About 5 minutes, most of it the build.
#   benchmarks/gpu/run.sh [--dry-run]      (results under ${OUT:-build-gpu/results})
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
if ((DRY == 0)) && ! "$PY" -c 'import torchtitan.models.llama3' 2>/dev/null; then
  echo "[gpu/run.sh] expected torchtitan importable by $PY, got an ImportError." \
       "Install it beside the image's torch: pip install torchtitan==0.2.2 torch==<the installed version>"
  exit 1
fi
run mkdir -p "$RESULTS"
run cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTITAN_ENABLE_CUDA=ON \
    -DLIBTORCH_ROOT="$TORCH_DIR" -DTITAN_BUILD_TESTS=OFF -DTITAN_BUILD_EXAMPLES=OFF
run cmake --build "$BUILD" --target bench_step_throughput
PEERS=("$PY" "$ROOT/benchmarks/peers/compare.py" --device cuda --configs gpu-1B-2048 --rounds 2 --build "$BUILD"
       --python "$PY" --json "$RESULTS/peers_gpu.json")
if ((DRY)); then
  "${PEERS[@]}" --dry-run  # prints the commands it would run (titan, torchtitan, eager), runs nothing
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$RESULTS/gpu.txt"
"${PEERS[@]}" 2>&1 | tee "$RESULTS/peers_gpu.txt"
