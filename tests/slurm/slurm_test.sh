#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The shipped scripts/slurm/train_llama3.sbatch, unchanged, on a Slurm cluster of 2 nodes in network namespaces
# (tests/slurm/slurm_cluster.sh), submitted with sbatch as a user would, its #SBATCH lines overridden on the command
# line for 2 CPU nodes x 2 tasks (no GPUs):
#
#   slurm_test.sh fsdp4   BUILD   FSDP 4 over 2 nodes x 2 tasks equals one process (loss by loss, 1e-5 relative)
#   slurm_test.sh requeue BUILD   `scontrol requeue` mid-run: every rank saves on Slurm's SIGTERM and exits 0, the job
#                                 runs again under its own id and resumes from that step to the one-process losses
#   slurm_test.sh signal  BUILD   the script's time-limit warning (`--signal=B:USR1@T`; the test sends the batch shell
#                                 the signal as slurmctld does, `scancel --batch --signal=USR1`, since Slurm's timer
#                                 fires up to 60 s early): the script requeues the job, which resumes as above
#   slurm_test.sh node    BUILD   a node dies mid-run (every process of its host killed, slurmd included): the job
#                                 ends as NODE_FAIL and no process of it is left on the surviving node
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
scenario="${1:?scenario}"
build="$(cd "${2:?build folder}" && pwd)"
fail() {
  echo "[slurm_test] $*" >&2
  exit 1
}
source "$here/slurm_cluster.sh"

SLURM_WORK="$(mktemp -d "${TMPDIR:-/tmp}/titan-slurm.XXXXXX")"
NODES=2
steps=6
job_flags=(--model.flavor debugmodel --model.hf_assets_path "$build/tests/assets/tokenizer"
  --training.dataset tinyshakespeare --training.dataset_path "$root/tests/assets/tinyshakespeare/input.txt"
  --training.seq_len 32 --training.steps "$steps" --training.num_threads 1 --debug.seed 7 --debug.deterministic true
  --lr_scheduler.warmup_steps 2 --activation_checkpoint.mode none)

# The one-process run: the same global batch (4 ranks x 2 sequences) in one process.
reference="$SLURM_WORK/reference"
"$build/bin/train_llama3" --config llama3_debugmodel "${job_flags[@]}" --training.local_batch_size 8 \
  --job.dump_folder "$reference" >"$SLURM_WORK/reference.log" 2>&1 ||
  { tail -20 "$SLURM_WORK/reference.log"; fail "the one-process run failed"; }

cluster_up
submit_dir="$SLURM_WORK/submit"
mkdir -p "$submit_dir"

# sbatch from the submit folder, as a user would; prints the job id.
submit() {
  (cd "$submit_dir" && TRAIN="$build/bin/train_llama3" CONFIG=llama3_debugmodel slurm sbatch --parsable \
    --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 "$@" "$root/scripts/slurm/train_llama3.sbatch" \
    "${job_flags[@]}" --training.local_batch_size 2 --parallelism.data_parallel_shard_degree 4 --comm.backend strict \
    "${extra_flags[@]}")
}
extra_flags=()

job_field() { slurm scontrol show job "$1" | grep -oE "(^| )$2=[^ ]*" | head -1 | cut -d= -f2; }

# Waits for the job to reach one of the states in $2 (a regex); prints the state.
wait_state() {
  local job=$1 want=$2 limit=${3:-300} state=""
  for _ in $(seq $((limit * 5))); do
    state=$(job_field "$job" JobState)
    [[ $state =~ ^($want)$ ]] && echo "$state" && return 0
    sleep 0.2
  done
  fail "expected job $job to reach $want within $limit s, got ${state:-no state}$(job_log "$job")"
}

# Slurm holds a requeued job back for a while (its BeginTime, about 2 minutes); the test lets it start at once.
release_requeued() {
  wait_state "$1" PENDING 120 >/dev/null
  slurm scontrol update JobId="$1" StartTime=now
}

# Waits until the job's dump folder has logged $2 steps.
wait_steps() {
  local job=$1 dump=$2 n=$3
  for _ in $(seq 600); do
    [[ -f $dump/metrics.jsonl ]] && (($(wc -l <"$dump/metrics.jsonl") >= n)) && return 0
    sleep 0.2
  done
  fail "expected job $job to log $n steps within 120 s$(job_log "$job")"
}

job_log() { local f="$submit_dir/titan-llama3-$1.out"; [[ -f $f ]] && printf '\n%s' "$(tail -30 "$f")"; }

# Step -> loss of a dump folder's metrics.jsonl, compared with the reference's from step $3 on.
compare_losses() {
  python3 - "$reference/metrics.jsonl" "$1/metrics.jsonl" "${2:-1}" <<'EOF'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss_metrics/global_avg_loss" in r:
            out[r["step"]] = r["loss_metrics/global_avg_loss"]  # a resumed run's repeat of a step replaces it
    return out
want, got, first = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
steps = sorted(s for s in want if s >= first)
missing = [s for s in steps if s not in got]
if missing: sys.exit(f"expected the steps {missing} in {sys.argv[2]}, got none")
worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in steps)
print(f"steps {steps[0]}-{steps[-1]}: largest relative loss difference {worst:.2e}")
if worst > 1e-5: sys.exit("expected every loss within 1e-5 relative of the one-process run's")
EOF
}

case "$scenario" in
  fsdp4)
    job=$(submit)
    state=$(wait_state "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL')
    [[ $state == COMPLETED ]] || fail "expected job $job COMPLETED, got $state$(job_log "$job")"
    out="$submit_dir/titan-llama3-$job.out"
    grep -q "FSDP(dp_shard=4)" "$out" || fail "expected the job's log to apply FSDP(dp_shard=4), got:$(job_log "$job")"
    # srun --label: each task's lines carry its rank; all 4 ran, 2 on each node.
    for r in 0 1 2 3; do grep -q "^ *$r: " "$out" || fail "expected lines from task $r in $out"; done
    [[ $(job_field "$job" NodeList) == "node[1-2]" && $(job_field "$job" NumTasks) == 4 ]] ||
      fail "expected 4 tasks on node[1-2], got $(job_field "$job" NumTasks) on $(job_field "$job" NodeList)"
    compare_losses "$submit_dir/outputs/titan-llama3-$job"
    ;;
  requeue | signal)
    # Checkpoints every 2 steps; the log kept across the requeue (sbatch truncates it on a restart by default).
    extra_flags=(--checkpoint.enable true --checkpoint.interval 2 --checkpoint.last_save_model_only false)
    job=$(submit --open-mode=append)
    dump="$submit_dir/outputs/titan-llama3-$job"
    wait_steps "$job" "$dump" 3
    if [[ $scenario == requeue ]]; then
      slurm scontrol requeue "$job"
    else
      slurm scancel --batch --signal=USR1 "$job"
    fi
    release_requeued "$job"
    state=$(wait_state "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL')
    [[ $state == COMPLETED ]] || fail "expected job $job COMPLETED after its requeue, got $state$(job_log "$job")"
    [[ $(job_field "$job" Restarts) == 1 ]] || fail "expected job $job to have run twice (Restarts=1), got Restarts=$(job_field "$job" Restarts)"
    out="$submit_dir/titan-llama3-$job.out"
    stopped=$(grep -o "Training stopped at step [0-9]* on SIGTERM" "$out" | head -1 | grep -o "[0-9][0-9]*" || true)
    [[ -n $stopped ]] || fail "expected rank 0 to stop on Slurm's SIGTERM and say so, got:$(job_log "$job")"
    grep -q "Resuming at step $((stopped + 1))" "$out" ||
      fail "expected the requeued job to resume at step $((stopped + 1)), after the step saved on SIGTERM$(job_log "$job")"
    compare_losses "$dump"
    ;;
  node)
    extra_flags=(--checkpoint.enable true --checkpoint.interval 2 --checkpoint.last_save_model_only false)
    job=$(submit --open-mode=append)
    dump="$submit_dir/outputs/titan-llama3-$job"
    wait_steps "$job" "$dump" 3
    # node2 dies: every process of its host, slurmd and the job's tasks there, at once.
    kill -9 $(ip netns pids "titan-mh-$CLUSTER_TAG-2") 2>/dev/null || true
    state=$(wait_state "$job" 'PENDING|NODE_FAIL|FAILED|CANCELLED|COMPLETED' 120)
    [[ $state == PENDING ]] || fail "expected job $job requeued (PENDING) when node2 died, got $state$(job_log "$job")"
    [[ $(slurm sinfo -h -n node2 -o '%t') == down* ]] ||
      fail "expected slurmctld to mark node2 down, got '$(slurm sinfo -h -n node2 -o '%t')'"
    # Nothing of the job is left on node1: its tasks were stopped, not orphaned.
    left=""
    for _ in $(seq 150); do
      left=$(for pid in $(ip netns pids "titan-mh-$CLUSTER_TAG-1"); do
        if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == train_llama3 ]]; then echo "$pid"; fi
      done)
      [[ -z $left ]] && break
      sleep 0.2
    done
    [[ -z $left ]] || fail "expected no train_llama3 left on node1 after node2 died, got pids $left"
    # node2 comes back: its slurmd starts again and the requeued job runs from its last checkpoint.
    on_host 2 slurmd -D >>"$SLURM_WORK/log/slurmd.node2.out" 2>&1 &
    # Released only once slurmctld has node2 idle again: a job started while the node is still returning to
    # service got an allocation whose step srun could never create ("Requested nodes are busy"), on a loaded host.
    node_state=""
    for _ in $(seq 300); do
      node_state=$(slurm sinfo -h -n node2 -o '%t')
      [[ $node_state == idle ]] && break
      sleep 0.2
    done
    [[ $node_state == idle ]] || fail "expected node2 idle within 60 s of its slurmd's restart, got '$node_state'"
    slurm scontrol update JobId="$job" StartTime=now
    state=$(wait_state "$job" 'COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL')
    [[ $state == COMPLETED ]] || fail "expected job $job COMPLETED once node2 was back, got $state$(job_log "$job")"
    grep -q "Resuming at step" "$submit_dir/titan-llama3-$job.out" ||
      fail "expected the requeued job to resume from its checkpoint$(job_log "$job")"
    compare_losses "$dump"
    ;;
  *) fail "expected fsdp4, requeue, signal or node, got '$scenario'" ;;
esac
echo "slurm $scenario: passed"
