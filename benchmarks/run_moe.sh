#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# MoE training steps, titan vs torchtitan, alternately in one run (after scripts/setup.sh): per round,
# bench_moe at ep 1,2,4 (titan's grouped GEMM), bench_moe at ep 1 with the per-expert loop (the experts'
# path torchtitan takes on a machine without SM90), then benchmarks/peers/moe_peer.py (torchtitan's
# model, one rank). Same flavor, global batch, sequence length, fp32, CPU, threads, steps.
#   benchmarks/run_moe.sh [rounds]            env: MODEL (deepseek_v3|qwen3), FLAVOR, SEQ, BATCH, STEPS, THREADS
# Prints every run, then the EP table (titan, medians over rounds) and the side-by-side table at one rank.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-${TITAN_HOME:-$HOME/.cache/titan}/venv/bin/python}"
BIN="${BUILD_DIR:-$ROOT/build}/bin/bench_moe"
ROUNDS="${1:-2}"
MODEL="${MODEL:-deepseek_v3}"
FLAVOR="${FLAVOR:-}"
SEQ="${SEQ:-128}"
BATCH="${BATCH:-4}"
STEPS="${STEPS:-3}"
THREADS="${THREADS:-1}"
OUT="$(mktemp -d)"
common=(--model "$MODEL" --seq-len "$SEQ" --batch "$BATCH" --steps "$STEPS" --warmup 1 --threads "$THREADS")
if [[ -n "$FLAVOR" ]]; then common+=(--flavor "$FLAVOR"); fi
for ((r = 0; r < ROUNDS; ++r)); do
  "$BIN" "${common[@]}" --ep 1,2,4 --json "$OUT/titan_$r.json"
  "$BIN" "${common[@]}" --ep 1 --grouped-mm 0 --json "$OUT/titan_loop_$r.json"
  "$PY" "$ROOT/benchmarks/peers/moe_peer.py" "${common[@]}" --json "$OUT/torchtitan_$r.json"
done
"$PY" - "$OUT" <<'PYEOF'
import glob, json, math, os, statistics, sys
out = sys.argv[1]
load = lambda pattern: [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, pattern)))]
titan, loop, peer = load("titan_[0-9]*.json"), load("titan_loop_*.json"), load("torchtitan_*.json")
t0 = titan[0]
med = lambda xs: statistics.median(xs)
print(f"\n{t0['model']} {t0['flavor']} ({t0['params'] / 1e6:.2f}M params, {t0['moe_layers']} MoE layers, "
      f"E={t0['experts']} K={t0['top_k']} D={t0['dim']}), global batch {t0['batch']} x {t0['seq_len']} tokens, fp32 CPU, "
      f"{t0['threads']} intra-op thread(s) per rank, medians over {len(titan)} round(s)")
print("\n| ep (ranks) | tok/s global | tok/s/rank | step (s) | all-to-all s/step | share | counts s/step | grad all-reduce s/step "
      "| a2a MB/step/rank | formula MB | measured/formula | Gloo all-to-all MB/s | bytes / bandwidth (s) | loss step 1 |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for i, run in enumerate(t0["runs"]):
    rs = [t["runs"][i] for t in titan]
    g = lambda k: med([x[k] for x in rs])
    bw = g("gloo_all_to_all_bytes_per_s")
    if run["ep"] == 1:  # no exchanges on one rank
        comm = " | ".join(["-"] * 9)
    else:
        comm = (f"{g('all_to_all_s'):.4f} | {100 * g('all_to_all_share'):.1f}% | {g('count_exchange_s'):.4f} | "
                f"{g('grad_all_reduce_s'):.4f} | {g('all_to_all_bytes') / 1e6:.2f} | {run['formula_bytes'] / 1e6:.2f} | "
                f"{g('all_to_all_bytes') / run['formula_bytes']:.3f} | {bw / 1e6:,.0f} | {g('bytes_over_bandwidth_s'):.4f}")
    print(f"| {run['ep']} | {g('tps_global'):,.0f} | {g('tps_rank'):,.0f} | {g('step_time_median'):.3f} | {comm} | "
          f"{rs[0]['losses'][0]:.4f} |")
checks = {t["data_checksum"] for t in titan + loop + peer}
print(f"\nbatch checksum {'agrees' if len(checks) == 1 else 'DIFFERS: ' + str(checks)} on every side; "
      f"ln(vocab) = {math.log(t0['vocab']):.4f}")
print("\n| one rank | experts | tok/s | step (s) | vs torchtitan | loss step 1 -> last |")
print("| --- | --- | --- | --- | --- | --- |")
ptps = med([p["tps"] for p in peer])
for name, runs, experts in (("titan", [t["runs"][0] for t in titan], "grouped_mm fp32"),
                            ("titan", [t["runs"][0] for t in loop], "per-expert loop"),
                            ("torchtitan 0.2.2", peer, "per-expert loop (use_grouped_mm off)")):
    tps = med([x["tps_global"] if "tps_global" in x else x["tps"] for x in runs])
    step = med([x["step_time_median"] for x in runs])
    print(f"| {name} | {experts} | {tps:,.0f} | {step:.3f} | {tps / ptps:.2f} | "
          f"{runs[0]['losses'][0]:.4f} -> {runs[0]['losses'][-1]:.4f} |")
PYEOF
