#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Kill loop: N trials of a 4-rank FSDP run of the debug model under `titan-run --max-restarts`, each with a
# random rank SIGKILLed at a random moment. Every trial must finish with losses bitwise equal to an
# uninterrupted run's; prints each trial's kill -> training-again time (the restarted job's first step
# line) and a summary. See docs/fault_tolerance.md.
#
#   scripts/kill_loop.sh [--trials N] [--steps S] [--interval K] [--build DIR] [--seed X]
set -euo pipefail

trials=5
steps=40
interval=5
build=build
seed=$RANDOM
while [[ $# -gt 0 ]]; do
  case "$1" in
    --trials) trials=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "kill_loop.sh: unknown flag '$1'" >&2; exit 2 ;;
  esac
done
RANDOM=$seed

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)
run=$build/bin/titan-run
trainer=$build/bin/train_llama3
for program in "$run" "$trainer"; do
  [[ -x $program ]] || { echo "kill_loop.sh: expected $program to be built (ninja -C $build titan-run train_llama3)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 TITAN_LOG_LEVEL=info

# The tests' debug job: tinyshakespeare with the tests' tokenizer, deterministic fp32 on CPU.
job() {
  echo --model.flavor debugmodel --model.hf_assets_path "$build/tests/assets/tokenizer" \
    --training.dataset tinyshakespeare --training.dataset_path "$root/tests/assets/tinyshakespeare/input.txt" \
    --training.seq_len 32 --training.local_batch_size 2 --training.steps "$steps" --training.num_threads 1 \
    --parallelism.data_parallel_shard_degree 4 --debug.seed 7 --debug.deterministic true \
    --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --job.dump_folder "$1"
}

# "step loss" of the last metrics.jsonl record of each step (a restarted run appends its replayed steps).
final_losses() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss_metrics/global_avg_loss" in r:
        last[r["step"]] = r["loss_metrics/global_avg_loss"]
for s in sorted(last):
    print(s, repr(last[s]))' "$1/metrics.jsonl"
}

# Seconds (fractional) since the epoch.
now() { date +%s.%N; }

# $(job ...) is split on purpose: the paths it holds have no spaces (mktemp, the checkout).
echo "reference: $steps steps, uninterrupted"
start=$(now)
# shellcheck disable=SC2046
"$run" --nproc-per-node 4 -- "$trainer" $(job "$work/reference") >"$work/reference.log" 2>&1
reference_seconds=$(echo "$(now) - $start" | bc)
final_losses "$work/reference" >"$work/reference.losses"
[[ $(wc -l <"$work/reference.losses") -eq $steps ]] || { echo "reference run logged the wrong number of steps" >&2; exit 1; }
echo "reference took ${reference_seconds} s"

failures=0
recoveries=()
for ((trial = 1; trial <= trials; trial++)); do
  dump=$work/trial$trial
  rank=$((RANDOM % 4))
  # A random moment of training: after the first step line, within the first 70% of the run.
  delay=$(echo "scale=2; $((RANDOM % 1000)) / 1000 * $reference_seconds * 0.7" | bc)
  log=$dump.log
  # shellcheck disable=SC2046
  "$run" --nproc-per-node 4 --max-restarts 3 --grace-seconds 5 -- "$trainer" $(job "$dump") \
    --checkpoint.enable true --checkpoint.interval "$interval" --checkpoint.last_save_model_only false \
    >"$log" 2>&1 &
  launcher=$!
  while kill -0 "$launcher" 2>/dev/null && ! grep -q '\[rank 0\].*step: *[0-9]*/' "$log" 2>/dev/null; do sleep 0.05; done
  sleep "$delay"
  # The launcher's children are the ranks, in rank order.
  mapfile -t pids < <(pgrep -P "$launcher" | sort -n)
  if [[ ${#pids[@]} -ne 4 ]]; then
    wait "$launcher" || true
    echo "trial $trial: the run ended before the kill (${delay} s into training); not counted"
    continue
  fi
  killed_at=$(now)
  kill -KILL "${pids[$rank]}"
  # Training again: the first step line rank 0 prints after the launcher's restart message.
  recovered_at=""
  while kill -0 "$launcher" 2>/dev/null; do
    if [[ -z $recovered_at ]] && sed -n '/titan-run: restarting the job/,$p' "$log" | grep -q '\[rank 0\].*step: *[0-9]*/'; then
      recovered_at=$(now)
    fi
    sleep 0.05
  done
  status=0
  wait "$launcher" || status=$?
  final_losses "$dump" >"$dump.losses" || true
  if [[ $status -ne 0 ]] || ! cmp -s "$work/reference.losses" "$dump.losses"; then
    failures=$((failures + 1))
    echo "trial $trial: FAILED (rank $rank killed ${delay} s into training; titan-run exit $status); log: $log"
    tail -20 "$log"
    trap - EXIT
    continue
  fi
  resumed=$(grep -o 'Resuming at step [0-9]*' "$log" | tail -1 || true)
  if [[ -z $recovered_at ]]; then
    # Killed after the last step: the restarted job found nothing left to train.
    echo "trial $trial: rank $rank killed ${delay} s into training; ${resumed:-restarted from scratch}; no step left to train; losses bitwise equal"
    continue
  fi
  seconds=$(echo "$recovered_at - $killed_at" | bc)
  recoveries+=("$seconds")
  echo "trial $trial: rank $rank killed ${delay} s into training; ${resumed:-restarted from scratch}; training again after ${seconds} s; losses bitwise equal"
done

if [[ ${#recoveries[@]} -gt 0 ]]; then
  printf '%s\n' "${recoveries[@]}" | sort -n | awk '{a[NR]=$1} END {printf "kill -> training again: %d trials, min %.2f s, median %.2f s, max %.2f s\n", NR, a[1], a[int((NR+1)/2)], a[NR]}'
fi
echo "seed $seed: $failures failed of $trials"
[[ $failures -eq 0 ]]
