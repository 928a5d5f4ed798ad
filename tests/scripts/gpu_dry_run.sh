#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The ctests "gpu script <name> dry run": the GPU scripts cannot run on a CPU machine, but their dry run
# can. It must parse, exit 0 and print the commands it would run, resolved: this build folder, the torch
# of this Python, and the values it derives (world size, rounds, threads per rank on CUDA).
#   tests/scripts/gpu_dry_run.sh <run|device_check> <build folder> <python>
set -euo pipefail
name="$1" build="$2" py="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
script="$root/benchmarks/gpu/$name.sh"
bash -n "$script"
torch="$("$py" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')"
run_dry=(env -u OUT BUILD="$build" PYTHON="$py" bash "$script" --dry-run)
case "$name" in
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
    # The stages in order of value, the carried programs unpacked (and, should they not start, the sm_90 build
    # here with the carried -dev packages); the deadline on the dry run's clock, where each stage takes its
    # whole limit; SKIP_BUILD and STAGES for a warm second call; and nothing made on disk.
    carry="$build/carry" out="$build/device-check-out" work="$build/device-check" bin="$build/bin"
    check="$root/benchmarks/gpu/device_check.py"
    job="--training.seq_len 64 --training.local_batch_size 4 --training.steps"
    fp32="--training.mixed_precision_param float32"
    one_b="--flavor 1B --n-layers 0 --tie-embeddings 0 --batch 4 --seq-len 2048 --steps 10 --warmup 3 --mixed-precision bf16"
    eight_b="--flavor 8B --n-layers 8 --tie-embeddings 0 --batch 2 --seq-len 2048 --steps 10 --warmup 3 --mixed-precision bf16"
    dry=(env OUT="$out" BUILD="$build" CARRY="$carry" PYTHON="$py" bash "$root/benchmarks/gpu/device_check.sh" --dry-run)
    stage() { echo "+ timeout -k 5 $1 $py $check $2 --build $build --results $work --gpu "; }
    every=(cuda_tests nccl_world1 curve20 throughput_1B_bf16 peer_eager_1B_bf16 throughput_1B_float8 trainer_nccl
           curves200 generate ac_doc snapshot memory_plan throughput_8B_bf16 throughput_8B_float8 sanitizer)
    order=()
    for name in "${every[@]}"; do order+=(--next "== stage $name (limit "); done
    # Time for all: every stage, in order, with its commands.
    DEADLINE_S=100000 "$here/expect_output.sh" \
      --next "+ tar -xzf $carry/programs.tar.gz -C $build" --next "+ program_wrappers $build " \
      --next "+ tar -xzf $carry/deps.tar.gz -C $build/deps" \
      --next "+ cmake -S $root -B $build/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DTITAN_ENABLE_CUDA=ON -DLIBTORCH_ROOT=$torch " \
      --contains " -DTITAN_CUDA_ARCHS=90 -DCMAKE_CUDA_ARCHITECTURES=90 " \
      --contains " -DCMAKE_PREFIX_PATH=$build/deps -DPKG_CONFIG_EXECUTABLE=$build/deps/bin/pkg-config" \
      --next "cmake --build $build/cmake --target titan_cuda_tests nccl_world1 train_llama3 titan-generate titan-plan titan-run bench_step_throughput" \
      "${order[@]}" \
      --line "+ timeout -k 5 60 $bin/titan_cuda_tests 2>&1 | tee $work/cuda_tests.log" \
      --line "+ timeout -k 5 60 $bin/nccl_world1 2>&1 | tee $work/nccl_world1.log" \
      --contains "$(stage 60 curve20)" \
      --contains "+ $bin/train_llama3 --model.flavor debugmodel --model.hf_assets_path $build/tests/assets/tokenizer" \
      --contains "$job 20 " --contains "--job.dump_folder $work/curve20/fp32 $fp32 --checkpoint.enable true > " \
      --line "+ $bin/bench_step_throughput --device cuda $one_b --json $work/throughput_1B_bf16/run.json > $work/throughput_1B_bf16/bench.txt 2>&1" \
      --contains "+ $py $root/benchmarks/peers/peer_step.py --model eager --device cuda --flavor 1B --n-layers 0 --batch 4 --seq-len 2048 --steps 10 --warmup 3 --mixed-precision bf16 --json $work/peer_eager_1B_bf16/run.json" \
      --contains "+ $bin/bench_step_throughput --device cuda $one_b --float8 tensorwise --json $work/throughput_1B_float8/run.json" \
      --contains "+ $bin/titan-run --nproc-per-node 1 $bin/train_llama3 " \
      --lines 3 "$job 200 " --contains "--job.dump_folder $work/curves200/bf16 --training.mixed_precision_param bfloat16 >" \
      --contains "--job.dump_folder $work/curves200/float8_tensorwise --model.converters float8 --float8.recipe_name tensorwise" \
      --contains "+ $bin/titan-generate --checkpoint $work/curve20/fp32/checkpoint --model.flavor debugmodel" \
      --contains "+ CUDA_VISIBLE_DEVICES=\"\" $bin/titan-generate --checkpoint $work/curve20/fp32/checkpoint" \
      --contains "$fp32 --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op >" \
      --contains "+ CUDA_VISIBLE_DEVICES=\"\" $bin/train_llama3 " \
      --contains "--profiling.enable_memory_snapshot true" \
      --contains "+ $bin/titan-plan --model.flavor 1B --training.seq_len 2048 --training.local_batch_size 2 " \
      --contains "+ $bin/bench_step_throughput --device cuda $eight_b --json $work/throughput_8B_bf16/run.json" \
      --contains "+ $bin/bench_step_throughput --device cuda $eight_b --float8 tensorwise --json $work/throughput_8B_float8/run.json" \
      --contains " --tool memcheck --target-processes all --error-exitcode 1 --print-limit 20 $bin/titan_cuda_tests 2>&1" \
      --lines 0 "[device_check] skip " \
      -- "${dry[@]}"
    # DEADLINE_S 200 on a clock where each stage takes its limit: 60 + 60 + 60 s leave 10 s (less the 10 s kept
    # for the summary), so the first throughput stage and every later one are skipped, each named.
    DEADLINE_S=200 "$here/expect_output.sh" \
      --next "== stage cuda_tests (limit 60 s, 190 s left)" --next "== stage nccl_world1 (limit 60 s, 130 s left)" \
      --next "== stage curve20 (limit 60 s, 70 s left)" \
      --next "[device_check] skip throughput_1B_bf16: its limit is 90 s, 10 s are left before DEADLINE_S=200" \
      --next "[device_check] skip sanitizer: its limit is 150 s, 10 s are left" \
      --lines 3 "== stage " --lines 12 "[device_check] skip " \
      -- "${dry[@]}"
    # A warm second call: no unpacking and no build, only the stages named, in the check's order.
    SKIP_BUILD=1 STAGES=sanitizer,curve20 "$here/expect_output.sh" \
      --line "[device_check] SKIP_BUILD=1: the programs an earlier call left in $bin" \
      --next "== stage curve20 " --next "== stage sanitizer " --lines 2 "== stage " \
      --lines 0 "tar -xzf" --lines 0 "cmake " \
      -- "${dry[@]}"
    if STAGES=curve20,bogus "${dry[@]}" >/dev/null 2>&1; then
      echo "[gpu_dry_run] expected STAGES=curve20,bogus to be refused" >&2; exit 1
    fi
    for made in "$work" "$out" "$bin"; do
      [[ ! -e "$made" ]] || { echo "[gpu_dry_run] expected the dry run to make nothing, got $made" >&2; exit 1; }
    done ;;
  *) echo "[gpu_dry_run] unknown script $name" >&2; exit 2 ;;
esac
