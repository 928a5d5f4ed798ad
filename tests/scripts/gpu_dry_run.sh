#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The ctests "gpu script <name> dry run": the GPU scripts cannot run on a CPU machine, but their dry run
# can. It must parse, exit 0 and print the commands it would run, resolved: this build folder, the torch
# of this Python, and the values it derives (world size, rounds, threads per rank on CUDA).
#   tests/scripts/gpu_dry_run.sh <distributed_world1|run> <build folder> <python>
set -euo pipefail
name="$1" build="$2" py="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
script="$root/benchmarks/gpu/$name.sh"
bash -n "$script"
torch="$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
run_dry=(env -u OUT BUILD="$build" PYTHON="$py" bash "$script" --dry-run)
case "$name" in
  distributed_world1)
    exec "$here/expect_output.sh" \
      --contains "-B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTITAN_ENABLE_CUDA=ON -DLIBTORCH_ROOT=$torch " \
      --line "+ $build/bin/nccl_world1 2>&1 | tee $build/results/nccl_world1.txt" \
      --line "+ $build/bin/titan-run --nproc-per-node 1 $build/bin/train_llama3 --config llama3_debugmodel --training.steps 30 --metrics.log_freq 10 --job.dump_folder $build/results/train_world1 2>&1 | tee $build/results/train_world1.txt" \
      -- "${run_dry[@]}" ;;
  run)
    # compare.py prints paths under the repository relative to it.
    bench="$build/bin/bench_step_throughput" peer_py="$py"
    [[ "$bench" == "$root/"* ]] && bench="${bench#"$root/"}"
    [[ "$peer_py" == "$root/"* ]] && peer_py="${peer_py#"$root/"}"
    shape="--device cuda --flavor 1B --n-layers 0 --seq-len 2048 --batch 4 --steps 20 --warmup 3 --threads 0 --json"
    shape8="--device cuda --flavor 8B --n-layers 8 --seq-len 2048 --batch 2 --steps 20 --warmup 3 --threads 0 --json"
    # One rank (no launcher), no thread count on CUDA, 2 rounds of each side in bf16 and in float8, two shapes.
    exec "$here/expect_output.sh" \
      --contains "-B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTITAN_ENABLE_CUDA=ON -DLIBTORCH_ROOT=$torch " \
      --lines 4 "+ $bench $shape " \
      --lines 4 "+ $peer_py benchmarks/peers/peer_step.py --model torchtitan $shape " \
      --lines 4 "+ $peer_py benchmarks/peers/peer_step.py --model eager $shape " \
      --lines 4 "+ $bench $shape8 " \
      --lines 4 "+ $peer_py benchmarks/peers/peer_step.py --model torchtitan $shape8 " \
      --lines 2 "_float8_titan_0.json --float8 tensorwise --tie-embeddings 0 --reshard-after-forward always" \
      -- "${run_dry[@]}" ;;
  *) echo "[gpu_dry_run] unknown script $name" >&2; exit 2 ;;
esac
