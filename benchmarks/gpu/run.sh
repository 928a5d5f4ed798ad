#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# titan vs its Python peers on a machine with one NVIDIA GPU (H100/H200: float8 needs sm_89 or newer):
# builds bench_step_throughput against the torch found there, then runs, alternately, titan, torchtitan's
# Llama 3 (pip torchtitan, as pinned in scripts/requirements.txt) and the plain eager model, in bf16 and in
# float8, world size 1, 3 warm-up + 20 timed steps, 2 rounds, on two shapes (untied on every side):
#   gpu-1B-2048     the whole Llama 3.2 1B shape (1.50B parameters), S 2048, B 4
#   gpu-8B-8L-2048  Llama 3 8B's shape with 8 of its 32 blocks (2.80B), S 2048, B 2: the whole 8B's fp32
#                   weights, grads and AdamW moments alone are 16 B x 8.03B = 128 GB, beyond one GPU
#                   without sharding or offload
# bf16: autocast with fp32 master weights and AdamW (torchtitan's maybe_enable_amp on one GPU). float8: the
# same plus tensorwise float8 for every Linear but the output head (titan's converter; torchao's
# convert_to_float8_training on the Python sides). Prints tokens/s, MFU (torchtitan's 6N + 12*L*D*S
# against its peak table: 989 TFLOP/s bf16 for H100/H200 SXM) and peak allocated memory per side and
# precision, and checks that every side's step-1 loss agrees with titan's. About 10 minutes with the build.
#   benchmarks/gpu/run.sh [--dry-run]      (results under ${OUT:-build-gpu/results})
# SIDES=titan,torchtitan,torchtitan-compile,eager adds torchtitan under torch.compile (compare.py's side;
# each run compiles cold in its warm-up steps, which the budget above does not include).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
if ((DRY == 0)) && ! "$PY" -c 'import torchtitan.models.llama3, torchao.float8' 2>/dev/null; then
  echo "[gpu/run.sh] expected torchtitan and torchao importable by $PY, got an ImportError." \
       "Install them beside the image's torch: pip install torchtitan==0.2.2 torchao==0.18.0 (no torch upgrade)"
  exit 1
fi
run mkdir -p "$RESULTS"
configure_cuda_build -DTITAN_BUILD_TESTS=OFF -DTITAN_BUILD_EXAMPLES=OFF
run cmake --build "$BUILD" --target bench_step_throughput
PEERS=("$PY" "$ROOT/benchmarks/peers/compare.py" --device cuda --configs "${CONFIGS:-gpu-1B-2048,gpu-8B-8L-2048}"
       --precisions bf16,float8 --rounds "${ROUNDS:-2}" --build "$BUILD" --python "$PY"
       --json "$RESULTS/peers_gpu.json" --sides "${SIDES:-titan,torchtitan,eager}")
if ((DRY)); then
  "${PEERS[@]}" --dry-run  # prints the commands it would run (titan, torchtitan, eager), runs nothing
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$RESULTS/gpu.txt"
"${PEERS[@]}" 2>&1 | tee "$RESULTS/peers_gpu.txt"
