#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The device check: what titan claims about NVIDIA GPUs, run on a machine with one (H100/H200), in order of
# evidence; sized to finish within 8 minutes with the build (not yet run on a GPU). From the repository root,
# with torch importable by python3:
#   benchmarks/gpu/prepare_carry.sh           # once, on a Debian machine with the -dev packages (setup.sh's)
#   benchmarks/gpu/device_check.sh            # on the GPU machine: the tree plus build-gpu-deps/ carried
#   benchmarks/gpu/device_check.sh --dry-run  # prints every command it would run, runs nothing
# Stages (each logged to $BUILD/device-check/<stage>.log; a failed stage does not stop the later ones):
#   build             configure $BUILD (only when it has no build.ninja) for sm_90 only, then build only the
#                     targets below that are missing or out of date
#   cuda_tests        titan_cuda_tests: the float8 cast kernels bit-exact against the CPU ones, and the MoE
#                     grouped GEMM's CUDA path against the CPU's per-expert loop
#   nccl              nccl_world1: a one-rank NCCL group over every collective titan uses (all-reduce,
#                     all-gather, reduce-scatter, all-to-all, broadcast, a send to itself and its receive)
#   curves            the debug model's 20-step fp32 curve vs the CPU golden; 200-step fp32, bf16 and float8
#                     curves vs the committed CPU ones (benchmarks/gpu/device_check.py says how close)
#   ac_doc            per-op activation checkpointing = no AC bitwise; document-masked attention = the CPU's
#   generate          titan-generate (greedy) on CUDA gives the CPU's token ids
#   snapshot          a CUDA memory snapshot (the allocator's pickle) written and read back
#   throughput_*      tokens/s, MFU and peak memory: the Llama 3.2 1B shape and Llama 3 8B's shape with 8
#                     blocks, bf16 autocast and float8 tensorwise (bench_step_throughput, 3 warm-up + 10 steps)
# Writes to ${OUT:-$BUILD/device-check/out}: summary.md (one row per stage, the throughput table),
# device_check.log (everything printed), results.tar.gz (the stages' logs, curves and JSON), and
# memory_snapshot.pickle (open it at pytorch.org/memory_viz). Exit status 0 only when every stage passed.
# BUILD (default build-gpu), CARRY (default build-gpu-deps) and PYTHON (default python3) override the paths.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
WORK="$BUILD/device-check"
DEST="${OUT:-$WORK/out}"
TARGETS=(titan_cuda_tests nccl_world1 train_llama3 titan-generate bench_step_throughput)
TOKENIZER="$BUILD/tests/assets/tokenizer"
STAGES_RUN=()

# Everything printed from here on is also in $DEST/device_check.log.
if ((DRY == 0)); then
  mkdir -p "$WORK" "$DEST"
  rm -f "$WORK/stages.tsv"
  exec > >(tee "$DEST/device_check.log") 2>&1
fi

# What the build needs from the machine itself; the rest comes from $CARRY or the system's -dev packages.
missing=()
for tool in cmake ninja c++ nvidia-smi; do command -v "$tool" >/dev/null || missing+=("$tool"); done
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[[ -x "$NVCC" ]] || missing+=(nvcc)
[[ "$TORCH_DIR" == "<torch>" ]] && missing+=("torch (import torch in $PY)")
if ((${#missing[@]})); then
  echo "[device_check] expected on this machine: ${missing[*]}; not found."
  ((DRY)) || exit 1
fi
[[ -d "$CARRY" ]] || echo "[device_check] no carried folder $CARRY: using this machine's -dev packages" \
                          "(benchmarks/gpu/prepare_carry.sh makes it)"

# stage NAME SECONDS cmd...: runs cmd under a time limit with its output in $WORK/NAME.log, and books
# PASS/FAIL and the seconds it took in $WORK/stages.tsv.
stage() {
  local name="$1" limit="$2"; shift 2
  echo "== stage $name"
  STAGES_RUN+=("$name")
  local start=$SECONDS status=PASS rc=0
  run_logged "$WORK/$name.log" timeout "$limit" "$@" || rc=$?
  if ((rc != 0)); then
    status=FAIL
    ((rc == 124)) && echo "[device_check] stage $name: stopped after its $limit s" | tee -a "$WORK/$name.log"
  fi
  if ((DRY == 0)); then
    printf '%s\t%s\t%s\n' "$name" "$status" $((SECONDS - start)) >>"$WORK/stages.tsv"
    write_summary >/dev/null || true  # so far: a run stopped from outside still leaves a summary
  fi
}
write_summary() { "$PY" "$ROOT/benchmarks/gpu/device_check.py" summary --results "$WORK" --out "$DEST/summary.md"; }

echo "[device_check] build $BUILD, results $WORK, summary $DEST/summary.md"
run mkdir -p "$WORK" "$DEST"
# The machine, for the summary: GPU, driver, torch, CUDA compiler, date and the tree's commit.
if ((DRY == 0)); then
  {
    date -u '+%Y-%m-%d %H:%M UTC'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
    "$NVCC" --version | tail -1
    c++ --version | head -1
    echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
         "$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo "(with local changes)")"
    echo "$(nproc) CPU cores"
  } >"$WORK/machine.txt"
  cat "$WORK/machine.txt"
fi

# build: configures $BUILD only when it has no build.ninja, then builds only what is missing or out of date.
build() {
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    configure_cuda_build -DCMAKE_CUDA_COMPILER="$NVCC" -DTITAN_CUDA_ARCHS=90 -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_POLICY_VERSION_MINIMUM=3.5 || return 1
  fi
  # The tests' tokenizer, which the CPU curves were trained with: carried, else trained here by the build (HF
  # tokenizers; another version than scripts/requirements.txt pins may train other merges).
  if [[ -f "$CARRY/tokenizer/tokenizer.json" ]]; then
    run mkdir -p "$TOKENIZER" || return 1
    run cp "$CARRY/tokenizer/tokenizer.json" "$CARRY/tokenizer/tokenizer_config.json" "$TOKENIZER/" || return 1
  else
    TARGETS+=(titan_test_tokenizer)
  fi
  run cmake --build "$BUILD" --target "${TARGETS[@]}"
}
summarise() {
  run "$PY" "$ROOT/benchmarks/gpu/device_check.py" summary --results "$WORK" --out "$DEST/summary.md"
  run tar -czf "$DEST/results.tar.gz" -C "$WORK" --exclude=checkpoint --exclude='*.pickle' --exclude=out .
}
echo "== stage build"
STAGES_RUN+=(build)
if ((DRY)); then
  build
else
  start=$SECONDS
  if build 2>&1 | tee "$WORK/build.log"; then
    printf 'build\tPASS\t%s\n' $((SECONDS - start)) >>"$WORK/stages.tsv"
    write_summary >/dev/null || true
  else
    printf 'build\tFAIL\t%s\n' $((SECONDS - start)) >>"$WORK/stages.tsv"
    summarise
    echo "[device_check] the build failed: nothing else ran (see $WORK/build.log)"
    exit 1
  fi
fi

stage cuda_tests 120 "$BUILD/bin/titan_cuda_tests"
stage nccl 120 "$BUILD/bin/nccl_world1"
CHECK=("$PY" "$ROOT/benchmarks/gpu/device_check.py")
for name in curves ac_doc generate snapshot; do
  stage "$name" 180 "${CHECK[@]}" "$name" --build "$BUILD" --results "$WORK"
  if ((DRY)); then "${CHECK[@]}" "$name" --build "$BUILD" --results "$WORK" --dry-run; fi
done
# The shapes of benchmarks/gpu/run.sh (untied embeddings), 10 timed steps: one-GPU MFU in bf16 and float8.
for shape in "1B 0 4" "8B 8 2"; do
  read -r flavor layers batch <<<"$shape"
  for precision in bf16 float8; do
    float8=(); [[ "$precision" == float8 ]] && float8=(--float8 tensorwise)
    stage "throughput_${flavor}_${precision}" 150 "$BUILD/bin/bench_step_throughput" --device cuda \
        --flavor "$flavor" --n-layers "$layers" --tie-embeddings 0 --seq-len 2048 --batch "$batch" --steps 10 \
        --warmup 3 --mixed-precision bf16 "${float8[@]}" --json "$WORK/throughput_${flavor}_${precision}.json"
  done
done

summarise
if ((DRY)); then
  run cp "$WORK/memory_snapshot.pickle" "$DEST/"
  echo "[device_check] stages: ${STAGES_RUN[*]}"
  exit 0
fi
# The snapshot comes back whole when it is small (what returns from a lent machine is at most 16 MiB a file).
if [[ -f "$WORK/memory_snapshot.pickle" ]]; then
  if (($(stat -c %s "$WORK/memory_snapshot.pickle") < 15 << 20)); then
    cp "$WORK/memory_snapshot.pickle" "$DEST/"
  else
    gzip -c "$WORK/memory_snapshot.pickle" >"$DEST/memory_snapshot.pickle.gz"
  fi
fi
failed="$(awk -F'\t' '$2 != "PASS" {print $1}' "$WORK/stages.tsv" | tr '\n' ' ')"
if [[ -n "$failed" ]]; then
  echo "[device_check] failed stages: $failed(see $DEST/summary.md)"
  exit 1
fi
echo "[device_check] every stage passed (see $DEST/summary.md)"
