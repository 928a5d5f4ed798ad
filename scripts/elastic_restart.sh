#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Elastic restart, end to end: two titan-run agents (`--nnodes 1:2`, 2 ranks each) stand for two nodes of
# a 4-rank FSDP job of the debug model (global batch 8 = 4 ranks x 1 microbatch of 2). Once the step-10
# checkpoint is written, the second agent is SIGKILLed (the node is lost); the first restarts the job on
# its 2 ranks (2 microbatches each), which resumes at step 11. The 20 losses must equal an uninterrupted
# 4-rank run's within 1e-5 relative (fp32 summation order differs); prints the kill -> training-again time.
# With --grow the other way round: the first agent trains alone on 2 ranks (2 microbatches each), the
# second joins after step 5, the first's trainer saves its step on SIGTERM and the job goes on with 4 ranks.
# See docs/fault_tolerance.md.
#
#   scripts/elastic_restart.sh [--grow] [--build DIR] [--port P]
set -euo pipefail

build=build
port=29511
grow=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --grow) grow=1; shift ;;
    *) echo "elastic_restart.sh: unknown flag '$1'" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)
run=$build/bin/titan-run
trainer=$build/bin/train_llama3
for program in "$run" "$trainer"; do
  [[ -x $program ]] || { echo "elastic_restart.sh: expected $program to be built (ninja -C $build titan-run train_llama3)" >&2; exit 1; }
done
work=$(mktemp -d)
[[ -z ${KEEP:-} ]] || echo "work folder $work"
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; [[ -n ${KEEP:-} ]] || rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 TITAN_LOG_LEVEL=info

job() {
  echo --model.flavor debugmodel --model.hf_assets_path "$build/tests/assets/tokenizer" \
    --training.dataset tinyshakespeare --training.dataset_path "$root/tests/assets/tinyshakespeare/input.txt" \
    --training.seq_len 32 --training.local_batch_size 2 --training.global_batch_size 8 --training.steps 20 \
    --training.num_threads 1 --parallelism.data_parallel_shard_degree -1 --debug.seed 7 --debug.deterministic true \
    --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --checkpoint.enable true --checkpoint.interval 10 \
    --checkpoint.last_save_model_only false --job.dump_folder "$1"
}

now() { date +%s.%N; }

echo "reference: 4 ranks, 20 steps, uninterrupted"
# shellcheck disable=SC2046
"$run" --nproc-per-node 4 -- "$trainer" $(job "$work/reference") >"$work/reference.log" 2>&1

agent() {  # exec: $! is then titan-run itself, not a subshell around it
  # shellcheck disable=SC2046
  exec "$run" --nnodes 1:2 --nproc-per-node 2 --rdzv-endpoint "127.0.0.1:$port" --max-restarts 1 \
    --rdzv-conf last_call_timeout=2 -- "$trainer" $(job "$work/elastic")
}
if [[ -n $grow ]]; then
  echo "elastic: 1 agent x 2 ranks; a second joins after step 5"
  agent >"$work/host.log" 2>&1 &
  pids+=($!)
  host=$!
  until grep -q "step: *5/20" "$work/host.log" 2>/dev/null; do
    kill -0 "$host" 2>/dev/null || { cat "$work/host.log" >&2; exit 1; }
    sleep 0.05
  done
  agent >"$work/joined.log" 2>&1 &
  pids+=($!)
  wait "$host" || { echo "the host titan-run failed:" >&2; tail -20 "$work/host.log" >&2; exit 1; }
  wait "${pids[1]}" || { echo "the joining titan-run failed:" >&2; tail -20 "$work/joined.log" >&2; exit 1; }
  grep -o "Training stopped at step.*" "$work/host.log" | head -1
else
  echo "elastic: 2 agents x 2 ranks; the second is SIGKILLed after the step-10 checkpoint"
  agent >"$work/host.log" 2>&1 &
  pids+=($!)
  host=$!
  sleep 0.5
  agent >"$work/lost.log" 2>&1 &
  pids+=($!)
  lost=$!
  until [[ -f $work/elastic/checkpoint/step-10/index.json ]]; do
    kill -0 "$host" 2>/dev/null || { cat "$work/host.log" >&2; exit 1; }
    sleep 0.2
  done
  before=$(grep -c "step: *11/20" "$work/host.log" || true)
  killed=$(now)
  kill -9 "$lost"
  # The restarted job's step 11 (the first attempt may have logged one already).
  until [[ $(grep -c "step: *11/20" "$work/host.log" || true) -gt $before ]]; do
    kill -0 "$host" 2>/dev/null || { cat "$work/host.log" >&2; exit 1; }
    sleep 0.05
  done
  again=$(now)
  wait "$host" || { echo "the host titan-run failed:" >&2; tail -20 "$work/host.log" >&2; exit 1; }
fi
grep -o "titan-run: restarting the job.*" "$work/host.log"
grep -o "Resuming at step .*" "$work/host.log" | head -1
cat "$work/elastic/restarts.jsonl"

python3 - "$work/reference/metrics.jsonl" "$work/elastic/metrics.jsonl" <<'EOF'
import json, sys
def last(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss_metrics/global_avg_loss" in r:
            out[r["step"]] = r["loss_metrics/global_avg_loss"]
    return out
want, got = last(sys.argv[1]), last(sys.argv[2])
assert sorted(want) == sorted(got) == list(range(1, 21)), (sorted(want), sorted(got))
worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
bitwise = sum(got[s] == want[s] for s in want)
print(f"20 losses: {bitwise} bitwise equal, largest relative difference {worst:.3g}")
sys.exit(0 if worst <= 1e-5 else 1)
EOF
[[ -n $grow ]] || echo "kill -> training again (step 11 on 2 ranks): $(echo "$again - $killed" | bc) s"
