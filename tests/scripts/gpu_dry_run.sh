#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The ctests "gpu script <name> dry run": the GPU scripts cannot run on a CPU machine, but their dry run
# can. It must parse, exit 0 and print the commands it would run, resolved: this build folder, the torch
# of this Python, and the values it derives (world size, rounds, threads per rank on CUDA).
#   tests/scripts/gpu_dry_run.sh <distributed_world1|run|device_check> <build folder> <python>
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
      --line "+ $build/bin/titan-run --nproc-per-node 1 $build/bin/train_llama3 --config llama3_debugmodel --training.dataset tinyshakespeare --training.dataset_path $root/tests/assets/tinyshakespeare/input.txt --training.steps 30 --metrics.log_freq 10 --job.dump_folder $build/results/train_world1 2>&1 | tee $build/results/train_world1.txt" \
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
  device_check)
    # Every stage, in order of evidence, on an sm_90-only build that uses the carried folder (a stand-in with
    # the files the script looks for), with the summary under $OUT; and nothing made on disk.
    carry="$(mktemp -d)"
    trap 'rm -rf "$carry"' EXIT
    mkdir -p "$carry/tokenizer" "$carry/bin"
    touch "$carry/tokenizer/tokenizer.json" "$carry/tokenizer/tokenizer_config.json"
    install -m 755 /dev/null "$carry/bin/pkg-config"
    out="$build/device-check-out" work="$build/device-check" train="$build/bin/train_llama3"
    job="--training.seq_len 64 --training.local_batch_size 4 --training.steps"
    fp32="--training.mixed_precision_param float32"
    bench="timeout 150 $build/bin/bench_step_throughput --device cuda"
    "$here/expect_output.sh" \
      --next "+ cmake -S $root -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTITAN_ENABLE_CUDA=ON -DLIBTORCH_ROOT=$torch " \
      --contains " -DTITAN_CUDA_ARCHS=90 -DCMAKE_CUDA_ARCHITECTURES=90 " \
      --contains " -DCMAKE_PREFIX_PATH=$carry -DPKG_CONFIG_EXECUTABLE=$carry/bin/pkg-config" \
      --next "+ cp $carry/tokenizer/tokenizer.json $carry/tokenizer/tokenizer_config.json $build/tests/assets/tokenizer/" \
      --next "+ cmake --build $build --target titan_cuda_tests nccl_world1 train_llama3 titan-generate bench_step_throughput" \
      --next "+ timeout 120 $build/bin/titan_cuda_tests 2>&1 | tee $work/cuda_tests.log" \
      --next "+ timeout 120 $build/bin/nccl_world1 2>&1 | tee $work/nccl.log" \
      --next "+ $train --model.flavor debugmodel --model.hf_assets_path $build/tests/assets/tokenizer" \
      --next "$job 20 " --next "--job.dump_folder $work/curves/fp32_20 $fp32 >" \
      --next "$job 200 " --next "--job.dump_folder $work/curves/fp32 $fp32 --checkpoint.enable true" \
      --next "$job 200 " --next "--job.dump_folder $work/curves/bf16 --training.mixed_precision_param bfloat16" \
      --next "$job 200 " \
      --next "--job.dump_folder $work/curves/float8_tensorwise --model.converters float8 --float8.recipe_name tensorwise" \
      --next "$job 20 " --next "$fp32 --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op" \
      --next "+ $train " --next "$fp32 --training.packing document" \
      --next "+ CUDA_VISIBLE_DEVICES=\"\" $train " --next "$fp32 --training.packing document" \
      --next "+ $build/bin/titan-generate --checkpoint $work/curves/fp32/checkpoint --model.flavor debugmodel" \
      --next "+ CUDA_VISIBLE_DEVICES=\"\" $build/bin/titan-generate --checkpoint $work/curves/fp32/checkpoint" \
      --next "--profiling.enable_memory_snapshot true" \
      --next "+ $bench --flavor 1B --n-layers 0 --tie-embeddings 0 --seq-len 2048 --batch 4 --steps 10 --warmup 3 --mixed-precision bf16 --json" \
      --next "+ $bench --flavor 1B --n-layers 0 --tie-embeddings 0 --seq-len 2048 --batch 4 --steps 10 --warmup 3 --mixed-precision bf16 --float8 tensorwise --json" \
      --next "+ $bench --flavor 8B --n-layers 8 --tie-embeddings 0 --seq-len 2048 --batch 2 --steps 10 --warmup 3 --mixed-precision bf16 --json" \
      --next "+ $bench --flavor 8B --n-layers 8 --tie-embeddings 0 --seq-len 2048 --batch 2 --steps 10 --warmup 3 --mixed-precision bf16 --float8 tensorwise --json" \
      --next "+ $py $root/benchmarks/gpu/device_check.py summary --results $work --out $out/summary.md" \
      --next "+ tar -czf $out/results.tar.gz -C $work " \
      --line "[device_check] stages: build cuda_tests nccl curves ac_doc generate snapshot throughput_1B_bf16 throughput_1B_float8 throughput_8B_bf16 throughput_8B_float8" \
      --lines 7 "+ $train " --lines 2 "+ CUDA_VISIBLE_DEVICES=\"\" " --lines 4 "+ $bench " \
      -- env OUT="$out" BUILD="$build" CARRY="$carry" PYTHON="$py" bash "$root/benchmarks/gpu/device_check.sh" --dry-run
    # A dry run makes nothing: no results folder, no summary.
    for made in "$work" "$out"; do
      [[ ! -e "$made" ]] || { echo "[gpu_dry_run] expected the dry run to make nothing, got $made" >&2; exit 1; }
    done ;;
  *) echo "[gpu_dry_run] unknown script $name" >&2; exit 2 ;;
esac
