#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The device check: what titan claims about NVIDIA GPUs, run on a machine with one (H100/H200) against its
# own torch, most valuable first, within a deadline, every result in $OUT as soon as it is made.
#   benchmarks/gpu/prepare_carry.sh            # before, on a CPU machine: build-gpu-carry/ (the programs)
#   benchmarks/gpu/device_check.sh             # on the GPU machine, from the repository root
#   benchmarks/gpu/device_check.sh --dry-run   # prints what it would run and skip, runs nothing
# Environment:
#   DEADLINE_S (520)   seconds from the start by which the summary is written; a stage whose limit does not
#                      fit in what is left (less 10 s for the summary) is skipped and named
#   STAGES (all)       a comma-separated subset of the stages below, run in their order
#   SKIP_BUILD=1       use the programs an earlier call left in $BUILD (a warm machine) and keep its results:
#                      the summary then holds both calls' stages
#   TITAN_COMMIT       the commit of the tree (.git may not travel); else git's, else "unknown"
#   BUILD (build-gpu), CARRY (build-gpu-carry), PYTHON (python3: the one with the image's torch), OUT
#   (default $BUILD/device-check/out)
# Before the stages: the machine's facts go to the summary, then the carried programs are unpacked into
# $BUILD and must start against this machine's torch; only when they do not (or nothing was carried) does
# it build them here (CMake, ninja, nvcc; sm_90 only; the carried deps.tar.gz supplies the -dev packages).
# The stages, each under its own time limit (seconds) in this order; a failed stage does not stop the next:
#   cuda_tests 60            titan_cuda_tests: float8 casts bit-exact vs CPU, MoE grouped GEMM vs CPU loop
#   nccl_world1 60           a one-rank NCCL group over every collective titan uses
#   curve20 60               the debug model's 20 fp32 steps vs the CPU golden curve
#   throughput_1B_bf16 90    bench_step_throughput, Llama 3.2 1B shape, B 4 x S 2048, bf16 autocast
#   peer_eager_1B_bf16 90    benchmarks/peers/peer_step.py --model eager on that shape (needs only torch)
#   throughput_1B_float8 90  the same shape, float8 tensorwise
#   trainer_nccl 60          curve20's job through titan-run --nproc-per-node 1
#   curves200 90             fp32, bf16 and float8 200-step curves vs the committed CPU ones
#   generate 60              greedy titan-generate from curve20's checkpoint, GPU vs CPU
#   ac_doc 90                per-op activation checkpointing; document-masked attention, GPU vs CPU
#   snapshot 60              the CUDA allocator's memory snapshot (bf16 debug model)
#   memory_plan 90           titan-plan's prediction vs the trainer's measured memory (1B shape)
#   throughput_8B_bf16 90    Llama 3 8B's shape with 8 blocks, B 2 x S 2048, bf16; then float8:
#   throughput_8B_float8 90
#   sanitizer 150            compute-sanitizer (memcheck) on titan_cuda_tests
# benchmarks/gpu/device_check.py holds the checks and why each bound holds on CUDA. $OUT gets, refreshed after
# every stage: summary.md, figures.json (every figure and check), device_check.log (all printed), logs.tar.gz
# (each stage's log and verdict), curves.csv, memory_snapshot.pickle (.gz when over 15 MiB). Exit status 0
# only when every selected stage ran and passed.
# --dry-run: the clock advances by each stage's limit (as if every stage ran to it), so DEADLINE_S shows which
# stages so slow a run would skip.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" "$@"
WORK="$BUILD/device-check"
DEST="${OUT:-$WORK/out}"
DEADLINE_S="${DEADLINE_S:-520}"
SKIP_BUILD="${SKIP_BUILD:-0}"
RESERVE_S=10
CHECK=("$PY" "$ROOT/benchmarks/gpu/device_check.py")
ORDER=(cuda_tests nccl_world1 curve20 throughput_1B_bf16 peer_eager_1B_bf16 throughput_1B_float8 trainer_nccl
       curves200 generate ac_doc snapshot memory_plan throughput_8B_bf16 throughput_8B_float8 sanitizer)
declare -A LIMIT=([cuda_tests]=60 [nccl_world1]=60 [curve20]=60 [throughput_1B_bf16]=90 [peer_eager_1B_bf16]=90
                  [throughput_1B_float8]=90 [trainer_nccl]=60 [curves200]=90 [generate]=60 [ac_doc]=90
                  [snapshot]=60 [memory_plan]=90 [throughput_8B_bf16]=90 [throughput_8B_float8]=90 [sanitizer]=150)
# A stage that reads another's runs is skipped when that one has not passed (in this call or a warm one's earlier).
declare -A NEEDS=([trainer_nccl]=curve20 [generate]=curve20 [ac_doc]=curve20 [peer_eager_1B_bf16]=throughput_1B_bf16)
say() { echo "[device_check] $*"; }

selected=("${ORDER[@]}")
unknown=""
if [[ -n "${STAGES:-}" ]]; then
  IFS=, read -ra wanted <<<"$STAGES"
  for name in "${wanted[@]}"; do [[ -n "${LIMIT[$name]:-}" ]] || unknown+="$name "; done
  selected=()
  for name in "${ORDER[@]}"; do [[ ",$STAGES," == *",$name,"* ]] && selected+=("$name"); done
fi

# The clock: seconds since the start, or in a dry run the sum of the limits of the stages "run" so far.
START=$SECONDS
FAKE_ELAPSED=0
elapsed() { if ((DRY)); then echo "$FAKE_ELAPSED"; else echo $((SECONDS - START)); fi; }
left() { echo $((DEADLINE_S - $(elapsed) - RESERVE_S)); }

if ((DRY == 0)); then
  mkdir -p "$WORK" "$DEST"
  ((SKIP_BUILD)) || rm -rf "$WORK"/stages.tsv "$WORK"/*.json "$WORK"/*.log "$WORK"/curves.csv "$WORK"/*.pickle
  exec 3>&1 4>&2 > >(tee -a "$DEST/device_check.log") 2>&1
  TEE=$!
fi

# refresh: $DEST gets the summary, the figures and whatever else exists so far (never fails the run).
refresh() {
  ((DRY)) && return 0
  "${CHECK[@]}" summary --results "$WORK" --out "$DEST" >/dev/null 2>"$WORK/summary.err" || {
    { echo "# titan device check (the Python summary failed: $(tail -1 "$WORK/summary.err"))"; echo
      sed 's/^/    /' "$WORK/machine.txt" 2>/dev/null; echo; cat "$WORK/stages.tsv" 2>/dev/null; } >"$DEST/summary.md"
  }
  [[ -f "$WORK/curves.csv" ]] && cp "$WORK/curves.csv" "$DEST/curves.csv.tmp" && mv "$DEST/curves.csv.tmp" "$DEST/curves.csv"
  local snapshot="$WORK/memory_snapshot.pickle"
  if [[ -f "$snapshot" && ! -f "$DEST/memory_snapshot.pickle" && ! -f "$DEST/memory_snapshot.pickle.gz" ]]; then
    if (($(stat -c %s "$snapshot") < 15 << 20)); then cp "$snapshot" "$DEST/"; else gzip -c "$snapshot" >"$DEST/memory_snapshot.pickle.gz"; fi
  fi
  (cd "$WORK" && tar -czf "$DEST/logs.tar.gz.tmp" --ignore-failed-read ./*.log ./*.json ./*.tsv ./*.txt ./*/*.txt ./*/*.json \
       2>/dev/null) && mv "$DEST/logs.tar.gz.tmp" "$DEST/logs.tar.gz"
  return 0
}
# record NAME STATUS SECONDS NOTE: one row of stages.tsv, then refresh.
record() {
  ((DRY)) || printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${LIMIT[$1]:-}" "${4:-}" >>"$WORK/stages.tsv"
  refresh
}
# On any exit: the summary once more, then the log's last lines written before the script ends.
finish() {
  refresh
  if ((DRY == 0)); then exec 1>&3 2>&4; wait "$TEE" 2>/dev/null; fi
  return 0
}
trap finish EXIT
passed() { [[ -f "$WORK/stages.tsv" ]] && awk -F'\t' -v s="$1" '$1 == s {st = $2} END {exit st != "PASS"}' "$WORK/stages.tsv"; }

# ---- the machine, before anything can stop the run ---------------------------------------------------------
commit="${TITAN_COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
fact() { local out; out="$(timeout 30 "$@" 2>&1)" && echo "$out" || echo "$1: unavailable (${out:0:120})"; }
SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
                                                /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)"
if ((DRY == 0)); then
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit of the tree: $commit"
    manifest="$(sed -n 's/^commit: //p;s/^made: /made /p' "$CARRY/manifest.txt" 2>/dev/null | paste -sd' ')"
    echo "programs: ${manifest:-no $CARRY/manifest.txt}"
    [[ -z "$manifest" || "$commit" == unknown || "$manifest" == "$commit"* || "$commit" == "${manifest%% *}"* ]] ||
      echo "note: the programs were built from another commit than the tree's: rerun prepare_carry.sh"
    echo "GPU: $(fact nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader)"
    echo "torch: $(fact "$PY" -c 'import torch; p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
print(torch.__version__, "CUDA", torch.version.cuda, p.name if p else "no GPU", p.multi_processor_count if p else "", "SMs")')"
    echo "nvcc: $(fact nvcc --version | tail -1); compute-sanitizer: ${SANITIZER:-not found}"
    echo "CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; DEADLINE_S $DEADLINE_S," \
         "STAGES ${STAGES:-all}, SKIP_BUILD $SKIP_BUILD"
  } >"$WORK/machine.txt"
  cat "$WORK/machine.txt"
  refresh
fi
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
if [[ -n "$unknown" ]]; then
  say "expected STAGES from: ${ORDER[*]}; got ${unknown% }."
  exit 2
fi

# ---- the programs: carried, else built here ---------------------------------------------------------------
unpack() {
  [[ -f "$CARRY/programs.tar.gz" || $DRY == 1 ]] || { say "no $CARRY/programs.tar.gz (benchmarks/gpu/prepare_carry.sh makes it)"; return 1; }
  run rm -rf "$BUILD/libexec" "$BUILD/lib" "$BUILD/bin"
  run mkdir -p "$BUILD"
  run tar -xzf "$CARRY/programs.tar.gz" -C "$BUILD"
  echo "+ program_wrappers $BUILD  # bin/<program>: libexec/<program> with lib/ and $TORCH_DIR's libraries"
  ((DRY)) || program_wrappers "$BUILD"
}
build_here() {
  local limit=$(($(left) - LIMIT[cuda_tests]))
  ((limit >= 120)) || { say "no time left to build here ($limit s)"; return 1; }
  say "building here (at most $limit s): sm_90 only, with the carried -dev packages"
  local targets=("${PROGRAMS[@]}")
  [[ -f "$BUILD/tests/assets/tokenizer/tokenizer.json" || $DRY == 1 ]] || targets+=(titan_test_tokenizer)
  if [[ -f "$CARRY/deps.tar.gz" || $DRY == 1 ]]; then
    run mkdir -p "$BUILD/deps" && run tar -xzf "$CARRY/deps.tar.gz" -C "$BUILD/deps"
  fi
  DEPS="$BUILD/deps" BUILD="$BUILD/cmake" configure_cuda_build -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
      -DTITAN_CUDA_ARCHS=90 -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_POLICY_VERSION_MINIMUM=3.5 || return 1
  run timeout "$limit" cmake --build "$BUILD/cmake" --target "${targets[@]}" || return 1
  run mkdir -p "$BUILD/libexec" "$BUILD/lib" "$BUILD/tests/assets/tokenizer"
  local name
  for name in "${PROGRAMS[@]}"; do run cp "$BUILD/cmake/bin/$name" "$BUILD/libexec/"; done
  [[ -f "$BUILD/tests/assets/tokenizer/tokenizer.json" ]] || run cp -r "$BUILD/cmake/tests/assets/tokenizer/." "$BUILD/tests/assets/tokenizer/"
  ((DRY)) || program_wrappers "$BUILD"
}
setup_start=$SECONDS
if ((SKIP_BUILD)); then
  say "SKIP_BUILD=1: the programs an earlier call left in $BUILD/bin"
  if ((DRY == 0)) && ! programs_start "$BUILD"; then
    record programs FAIL $((SECONDS - setup_start)) "SKIP_BUILD=1 but $BUILD/bin's programs do not start: run without it"
    for name in "${selected[@]}"; do record "$name" SKIP 0 "no programs"; done
    exit 1
  fi
  record programs PASS $((SECONDS - setup_start)) "SKIP_BUILD=1: an earlier call's"
else
  ok=0
  unpack && { ((DRY)) || programs_start "$BUILD"; } && ok=1
  if ((DRY)); then
    say "if the programs do not start, they are built here:"
    build_here
  elif ((ok == 0)); then
    build_here && programs_start "$BUILD" && ok=1
    if ((ok == 0)); then
      record programs FAIL $((SECONDS - setup_start)) "neither carried nor built programs start (device_check.log)"
      for name in "${selected[@]}"; do record "$name" SKIP 0 "no programs"; done
      exit 1
    fi
  fi
  record programs PASS $((SECONDS - setup_start)) "$([[ -d "$BUILD/cmake" ]] && echo "built here" || echo "carried")"
fi

# ---- the stages --------------------------------------------------------------------------------------------
# stage_command NAME: the stage's command in the array `cmd`.
stage_command() {
  case "$1" in
    cuda_tests) cmd=("$BUILD/bin/titan_cuda_tests") ;;
    nccl_world1) cmd=("$BUILD/bin/nccl_world1") ;;
    sanitizer) cmd=("${SANITIZER:-compute-sanitizer}" --tool memcheck --target-processes all --error-exitcode 1
                    --print-limit 20 "$BUILD/bin/titan_cuda_tests") ;;
    *) cmd=("${CHECK[@]}" "$1" --build "$BUILD" --results "$WORK" --gpu "$GPU_NAME") ;;
  esac
}
failures=0
for name in "${selected[@]}"; do
  limit="${LIMIT[$name]}"
  need="${NEEDS[$name]:-}"
  if [[ -n "$need" ]] && ((DRY == 0)) && ! passed "$need"; then
    say "skip $name: it needs $need, which has not passed"
    record "$name" SKIP 0 "needs $need, which has not passed"
    failures=$((failures + 1))
    continue
  fi
  if ((limit > $(left))); then
    say "skip $name: its limit is $limit s, $(left) s are left before DEADLINE_S=$DEADLINE_S"
    record "$name" SKIP 0 "deadline: limit $limit s, $(left) s left"
    failures=$((failures + 1))
    continue
  fi
  echo "== stage $name (limit $limit s, $(left) s left)"
  start=$SECONDS
  rc=0
  stage_command "$name"
  run_logged "$WORK/$name.log" timeout -k 5 "$limit" "${cmd[@]}" || rc=$?
  if ((DRY)); then
    [[ "$name" == cuda_tests || "$name" == nccl_world1 || "$name" == sanitizer ]] ||
      "${CHECK[@]}" "$name" --build "$BUILD" --results "$WORK" --dry-run
    FAKE_ELAPSED=$((FAKE_ELAPSED + limit))
    continue
  fi
  status=PASS note=""
  if ((rc != 0)); then
    status=FAIL
    failures=$((failures + 1))
    ((rc == 124 || rc == 137)) && note="stopped at its limit of $limit s"
  fi
  record "$name" "$status" $((SECONDS - start)) "$note"
done

if ((DRY)); then
  say "stages: ${selected[*]}"
  exit 0
fi
say "done in $(elapsed) s: $failures of ${#selected[@]} stages failed or were skipped (see $DEST/summary.md)"
((failures == 0))
