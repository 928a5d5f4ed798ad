#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The ctest "gpu device check: pass/fail rules on synthetic folders": benchmarks/gpu/device_check.py judges
# results folders made here (--judge-only: it runs nothing), where a GPU run would have left them: runs that
# keep every bound pass, and runs that break several fail on each broken bound with every other check still
# reported. Then device_check.sh itself, not dry, over stand-in programs on a stand-in machine: the machine's
# facts, the deadline skipping a stage on the real clock, a failed stage, and what lands in $OUT.
#   tests/scripts/gpu_check_rules.sh <scratch folder> <python>
set -euo pipefail
scratch="$1" py="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
check="$root/benchmarks/gpu/device_check.py"
rm -rf "$scratch"
mkdir -p "$scratch"
fail() { echo "[gpu_check_rules] $*" >&2; exit 1; }

# curves FOLDER NAME STEPS EXPR: NAME's metrics.jsonl under FOLDER, step s's loss = EXPR (python, over s, golden,
# cpu: the golden curve and the committed CSV's columns).
curves() {
  "$py" - "$@" <<'EOF'
import json, os, sys
sys.path.insert(0, os.environ["CHECK_DIR"])
import device_check as d
folder, name, steps, expr = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
golden, cpu = d.golden_curve(), d.committed_curves()
os.makedirs(os.path.join(folder, name), exist_ok=True)
with open(os.path.join(folder, name, "metrics.jsonl"), "w") as f:
    for s in range(1, steps + 1):
        f.write(json.dumps({"step": s, "loss_metrics/global_avg_loss": eval(expr)}) + "\n")
EOF
}
export CHECK_DIR="$root/benchmarks/gpu"
# judge STAGE FOLDER EXIT TEXT...: the stage's verdict on FOLDER exits EXIT and prints every TEXT.
judge() {
  local stage="$1" folder="$2" want="$3" rc=0 out text; shift 3
  out="$("$py" "$check" "$stage" --build "$folder" --results "$folder" --judge-only 2>&1)" || rc=$?
  printf '%s\n' "$out"
  ((rc == want)) || fail "expected $stage on $folder to exit $want, got $rc"
  for text in "$@"; do grep -qF -- "$text" <<<"$out" || fail "expected $stage on $folder to print: $text"; done
}

# curve20: the golden curve 5e-5 relative off passes; 2e-4 off fails (fp32 reordering stays near 1e-7).
good="$scratch/good" bad="$scratch/bad"
curves "$good" curve20/fp32 20 "golden[s - 1] * (1 + 5e-5 * (-1) ** s)"
curves "$bad" curve20/fp32 20 "golden[s - 1] * (1 + (2e-4 if s == 7 else 0))"
judge curve20 "$good" 0 "ok   fp32, 20 steps, vs the golden CPU curve: 5e-05 at step " "PASS: 2 checks"
judge curve20 "$bad" 1 "FAIL fp32, 20 steps, vs the golden CPU curve: 0.0002 at step 7 (bound: <= 0.0001)" \
      "ok   fp32, 20 steps learns" "FAIL: 1 of 2 checks: fp32, 20 steps, vs the golden CPU curve"

# curves200: the committed curves themselves (fp32 5e-5 off) pass. Broken: fp32 2e-4 off at one step, bf16
# that is fp32 (a silent fallback: no effect), float8 with 3 times its effect: three failures, all reported (the
# bounds and distances follow the committed CSV, so only their form is matched here).
curves "$good" curves200/fp32 200 "cpu['fp32'][s - 1] + 5e-5"
curves "$good" curves200/bf16 200 "cpu['bf16'][s - 1]"
curves "$good" curves200/float8_tensorwise 200 "cpu['float8_tensorwise'][s - 1]"
judge curves200 "$good" 0 "PASS: 6 checks"
[[ -f "$good/curves.csv" ]] || fail "expected curves200 to write $good/curves.csv"
[[ "$(sed -n 1p "$good/curves.csv")" == "step,fp32,bf16,float8_tensorwise" && $(wc -l <"$good/curves.csv") == 201 ]] ||
  fail "expected curves.csv to hold a header and 200 steps of fp32, bf16 and float8_tensorwise"
curves "$bad" curves200/fp32 200 "cpu['fp32'][s - 1] + (2e-4 if s == 100 else 0)"
curves "$bad" curves200/bf16 200 "cpu['fp32'][s - 1] + (2e-4 if s == 100 else 0)"
curves "$bad" curves200/float8_tensorwise 200 "cpu['fp32'][s - 1] + 3 * (cpu['float8_tensorwise'][s - 1] - cpu['fp32'][s - 1])"
judge curves200 "$bad" 1 "FAIL fp32, 200 steps, vs the committed CPU curve: 0.0002 at step 100" \
      "FAIL bf16's effect (distance from this GPU's fp32): 0 (bound: in (" \
      "FAIL float8_tensorwise's effect (distance from this GPU's fp32): 0.0" \
      "ok   float8_tensorwise, 200 steps learns" "FAIL: 3 of 6 checks"

# Bit for bit: titan-run at world size 1 and per-op AC against curve20; one ulp off fails.
for run in trainer_nccl/fp32 ac_doc/per_op_ac ac_doc/document ac_doc/document_cpu; do
  curves "$good" "$run" 20 "golden[s - 1]"
done
curves "$good" curve20/fp32 20 "golden[s - 1]"
cp -r "$good/curve20" "$bad/"
curves "$bad" trainer_nccl/fp32 20 "golden[s - 1] + (2 ** -20 if s == 20 else 0)"
judge trainer_nccl "$good" 0 "ok   titan-run, world size 1, vs curve20: 0 at step 1 (bound: <= 0)"
judge trainer_nccl "$bad" 1 "FAIL titan-run, world size 1, vs curve20: 9.54e-07 at step 20 (bound: <= 0)"
judge ac_doc "$good" 0 "PASS: 2 checks"
# A stage whose input is missing says which stage to run first.
judge ac_doc "$scratch/empty" 1 "FAIL: expected curve20's run in $scratch/empty/curve20/fp32, got none: run STAGES=curve20 first"

# generate: the same ids pass; one token off fails, naming where.
mkdir -p "$good/generate" "$bad/generate" "$good/curve20/fp32/checkpoint"
ids='{"ids": [5, 6, 7]}'
printf '%s\n%s\n' "$ids" "$ids" | tee "$good/generate/device.txt" "$good/generate/cpu.txt" "$bad/generate/cpu.txt" >/dev/null
printf '%s\n%s\n' "$ids" '{"ids": [5, 6, 8]}' >"$bad/generate/device.txt"
judge generate "$good" 0 "ok   greedy token ids, GPU vs CPU: 6 tokens, first difference: none"
judge generate "$bad" 1 "FAIL greedy token ids, GPU vs CPU: 6 tokens, first difference: prompt 2, token 3"

# memory_plan: the planner's exact parts to the byte, activations and the reserved peak within 10%; a measured
# reserved peak 15% over the plan fails, and so does a missing part (nan).
plan='{"bytes": {"parameters": 1073741824, "gradients": 1073741824, "optimizer": 2147483648, "activations": 4294967296, "reserved": 10737418240}}'
for folder in "$good" "$bad"; do mkdir -p "$folder/memory_plan/run"; echo "titan-plan: $plan" >"$folder/memory_plan/plan.json"; done
echo '{"step": 3, "memory/parameters(GiB)": 1.0, "memory/gradients(GiB)": 1.0, "memory/optimizer(GiB)": 2.0, "memory/activations(GiB)": 4.2, "memory/max_reserved(GiB)": 10.5}' \
  >"$good/memory_plan/run/metrics.jsonl"
echo '{"step": 3, "memory/parameters(GiB)": 1.0, "memory/optimizer(GiB)": 2.0, "memory/activations(GiB)": 4.2, "memory/max_reserved(GiB)": 11.5}' \
  >"$bad/memory_plan/run/metrics.jsonl"
judge memory_plan "$good" 0 "ok   reserved: measured vs planned: 10.500 vs 10.000 GiB (bound: within 10%)" "PASS: 5 checks"
judge memory_plan "$bad" 1 "FAIL gradients: measured vs planned: nan vs 1.000 GiB (bound: to the byte)" \
      "FAIL reserved: measured vs planned: 11.500 vs 10.000 GiB (bound: within 10%)" "FAIL: 2 of 5 checks"

# The eager peer against titan's run of the same shape: the same tokens, step-1 losses within 6 / sqrt(8192).
throughput() {  # throughput FILE SIDE CHECKSUM LOSS
  cat >"$1" <<EOF
{"side": "$2", "flavor": "1B", "n_layers": 16, "params": 1.5e9, "batch": 4, "seq_len": 2048, "mixed_precision": "bf16",
 "float8": "none", "tps": 40000.0, "tflops": 400.0, "mfu_declared": 40.4, "peak_memory_bytes": 3e10,
 "step_time_median": 0.2, "data_checksum": $3, "losses": [$4, 11.0]}
EOF
}
mkdir -p "$good/peer_eager_1B_bf16" "$bad/peer_eager_1B_bf16"
mkdir -p "$good/throughput_1B_bf16" "$bad/throughput_1B_bf16"
throughput "$good/throughput_1B_bf16/run.json" titan 123 11.80
throughput "$good/peer_eager_1B_bf16/run.json" eager 123 11.85
cp "$good/throughput_1B_bf16/run.json" "$bad/throughput_1B_bf16/"
throughput "$bad/peer_eager_1B_bf16/run.json" eager 124 11.90
judge peer_eager_1B_bf16 "$good" 0 "ok   the peer's step-1 loss vs titan's: 0.0500 (bound: <= 6 / sqrt(8192) = 0.0663)"
judge peer_eager_1B_bf16 "$bad" 1 "FAIL the peer's tokens: 124" "FAIL the peer's step-1 loss vs titan's: 0.1000"

# The summary: every stage row (a skipped one with its reason), every check, the throughput table, the JSON.
printf '%s\n' $'programs\tPASS\t3\t\tcarried' $'curves200\tFAIL\t40\t90\t' $'throughput_1B_bf16\tPASS\t30\t90\t' \
  $'peer_eager_1B_bf16\tFAIL\t30\t90\t' $'sanitizer\tSKIP\t0\t150\tdeadline: limit 150 s, 12 s left' \
  >"$bad/stages.tsv"
echo "GPU: Stand-in GPU, 80 GiB" >"$bad/machine.txt"
"$py" "$check" summary --results "$bad" --out "$bad/out" >/dev/null
for text in "    GPU: Stand-in GPU, 80 GiB" "| sanitizer | SKIP | 0 | 150 | deadline: limit 150 s, 12 s left |" \
            "| curves200 | bf16's effect (distance from this GPU's fp32) | 0 | in (" \
            "| titan | 1B (16 layers, 1.50B) | bf16 | 4 x 2048 | 40000 | 400.0 | 40.4% | 27.9 | 0.200 |"; do
  grep -qF -- "$text" "$bad/out/summary.md" || fail "expected $bad/out/summary.md to hold: $text"
done
"$py" - "$bad/out/figures.json" <<'EOF' || fail "expected figures.json to merge the stages, checks and runs"
import json, sys
j = json.load(open(sys.argv[1]))
assert [s["stage"] for s in j["stages"]] == ["programs", "curves200", "throughput_1B_bf16", "peer_eager_1B_bf16",
                                             "sanitizer"], j["stages"]
assert sum(not c["ok"] for c in j["checks"]["peer_eager_1B_bf16"]) == 2
assert len(j["checks"]["curves200"]) == 6 and sum(not c["ok"] for c in j["checks"]["curves200"]) == 3
assert sorted(r["side"] for r in j["throughput"]) == ["eager", "titan"]
EOF

# device_check.sh over stand-ins: SKIP_BUILD=1 with programs in $BUILD/bin that print their probe texts, a
# passing titan_cuda_tests, a failing nccl_world1, and a deadline that leaves no room for the 150 s sanitizer
# (159 s less the 10 kept for the summary) but 89 s of slack for the two 60 s stages before it.
build="$scratch/device/build" out="$scratch/device/out" fake="$scratch/device/path"
mkdir -p "$build/bin" "$fake"
source "$root/benchmarks/gpu/common.sh"
for name in "${PROGRAMS[@]}"; do
  printf '#!/bin/sh\n[ "$CUDA_VISIBLE_DEVICES" = "" ] && [ -n "${CUDA_VISIBLE_DEVICES+set}" ] && { echo "%s"; exit 1; }\n' \
    "${PROBE_TEXT[$name]}" >"$build/bin/$name"
done
echo 'echo "All tests passed (3 assertions in 2 test cases)"' >>"$build/bin/titan_cuda_tests"
echo 'echo "nccl_world1: MISMATCH"; exit 1' >>"$build/bin/nccl_world1"
chmod +x "$build/bin"/*
printf '#!/bin/sh\necho "Stand-in GPU, 81559 MiB, 580.00"\n' >"$fake/nvidia-smi"
chmod +x "$fake/nvidia-smi"
rc=0
PATH="$fake:$PATH" OUT="$out" BUILD="$build" PYTHON="$py" TITAN_COMMIT=0123456789ab SKIP_BUILD=1 DEADLINE_S=159 \
  STAGES=sanitizer,nccl_world1,cuda_tests bash "$root/benchmarks/gpu/device_check.sh" >"$scratch/device.log" 2>&1 ||
  rc=$?
cat "$scratch/device.log"
((rc == 1)) || fail "expected device_check.sh to exit 1 (a failed and a skipped stage), got $rc"
for text in "commit of the tree: 0123456789ab" "GPU: Stand-in GPU, 81559 MiB, 580.00" \
            "| programs | PASS |" "| cuda_tests | PASS |" "| nccl_world1 | FAIL |" \
            "| sanitizer | SKIP | 0 | 150 | deadline: limit 150 s, "; do
  grep -qF -- "$text" "$out/summary.md" || fail "expected $out/summary.md to hold: $text"
done
files="$(cd "$out" && ls)"
[[ "$files" == $'device_check.log\nfigures.json\nlogs.tar.gz\nsummary.md' ]] ||
  fail "expected \$OUT to hold device_check.log, figures.json, logs.tar.gz and summary.md, got: $files"
listing="$(tar -tzf "$out/logs.tar.gz")"
grep -qx "./nccl_world1.log" <<<"$listing" || fail "expected nccl_world1.log in logs.tar.gz, got: $listing"
grep -qF "nccl_world1: MISMATCH" "$out/device_check.log" || fail "expected the stages' output in device_check.log"
echo "[gpu_check_rules] every rule held"
