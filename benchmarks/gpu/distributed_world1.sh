#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The distributed runtime on a machine with one NVIDIA GPU: builds titan against the torch found there,
# runs the NCCL smoke test (a one-rank NCCL group, every collective titan uses), then trains the debug
# model on tinyshakespeare (in the repository: a GPU image has no fortunes files) through titan-run (world
# size 1). Fits in a few minutes. Usage:
#   benchmarks/gpu/distributed_world1.sh [--dry-run]      (results under ${OUT:-build-gpu/results})
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
run mkdir -p "$RESULTS"
configure_cuda_build -DTITAN_BUILD_TESTS=OFF
run cmake --build "$BUILD" --target nccl_world1 train_llama3 titan-run
run_logged "$RESULTS/nccl_world1.txt" "$BUILD/bin/nccl_world1"
run_logged "$RESULTS/train_world1.txt" "$BUILD/bin/titan-run" --nproc-per-node 1 "$BUILD/bin/train_llama3" \
    --config llama3_debugmodel --training.dataset tinyshakespeare \
    --training.dataset_path "$ROOT/tests/assets/tinyshakespeare/input.txt" --training.steps 30 --metrics.log_freq 10 \
    --job.dump_folder "$RESULTS/train_world1"
