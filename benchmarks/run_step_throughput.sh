#!/usr/bin/env bash
# titan vs the plain-PyTorch eager peer, alternately in one run, same flavor/batch/sequence/threads.
#   benchmarks/run_step_throughput.sh [rounds]      (after scripts/setup.sh)
# Prints each run and a summary table (median tokens/s over rounds, ratio titan/peer).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TITAN_HOME:-$HOME/.cache/titan}/venv/bin/python"
BIN="${BUILD_DIR:-$ROOT/build}/bin/bench_step_throughput"
ROUNDS="${1:-2}"
OUT="$(mktemp -d)"
CONFIGS=("debugmodel 256 8 5 2" "debugmodel 2048 2 3 2" "100M 512 4 2 2" "debugmodel 256 8 5 1")
for ((r = 0; r < ROUNDS; ++r)); do
  for cfg in "${CONFIGS[@]}"; do
    read -r flavor seq batch steps threads <<<"$cfg"
    tag="${flavor}_${seq}_${batch}_${threads}t_$r"
    "$BIN" --flavor "$flavor" --seq-len "$seq" --batch "$batch" --steps "$steps" --warmup 1 --threads "$threads" \
      --json "$OUT/titan_$tag.json"
    OMP_NUM_THREADS="$threads" "$PY" "$ROOT/benchmarks/peers/llama3_eager.py" --flavor "$flavor" --seq-len "$seq" \
      --batch "$batch" --steps "$steps" --warmup 1 --threads "$threads" --json "$OUT/peer_$tag.json"
  done
done
"$PY" - "$OUT" "${CONFIGS[@]}" <<'PYEOF'
import json, statistics, sys, glob, os
out = sys.argv[1]
print(f"\n| flavor | S | B | threads | titan tok/s | peer tok/s | titan/peer | titan MFU vs GEMM peak |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for cfg in sys.argv[2:]:
    flavor, seq, batch, _, threads = cfg.split()
    tag = f"{flavor}_{seq}_{batch}_{threads}t_"
    t = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, f"titan_{tag}*.json")))]
    p = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, f"peer_{tag}*.json")))]
    tt = statistics.median(x["tps"] for x in t); pt = statistics.median(x["tps"] for x in p)
    mfu = statistics.median(x["mfu_gemm"] for x in t)
    print(f"| {flavor} | {seq} | {batch} | {threads} | {tt:,.0f} | {pt:,.0f} | {tt/pt:.2f} | {mfu:.1f}% |")
PYEOF
