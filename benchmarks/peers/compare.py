# SPDX-License-Identifier: BSD-3-Clause
"""titan vs the Python peers, alternately in one invocation: for each configuration and round it runs
titan's step (bench_step_throughput; 2 ranks: titan-run processes, FSDP over Gloo), torchtitan's Llama 3
from the pip package (peer_step.py --model torchtitan; 2 ranks: torchrun processes, torchtitan's
apply_fsdp = FSDP2 over Gloo) and the plain eager model (peer_step.py --model eager; 2 ranks: FSDP2 with
the same units). Same flavor, batch per rank, sequence length, fp32, AdamW and clipping on every side.

Threads: 1 rank uses 2 intra-op threads, 2 ranks 1 each (2 cores in all), set three ways on every side:
OMP_NUM_THREADS and MKL_NUM_THREADS in the environment, and --threads N, which calls at::set_num_threads
(titan) or torch.set_num_threads (peers).

Prints each run, then a table of tokens/s per rank (median over rounds), step time min/median/max over all
timed steps of all rounds, the ratio titan/peer and titan's model FLOP/s as a share of the fp32 GEMM rate
measured in the same titan process; writes everything to --json. `--smoke` runs a one-layer model for two
steps (the ctest: checks that every side trains and the JSON has its fields).

    benchmarks/peers/run_peers.sh                      # the docs/performance.md table
    benchmarks/peers/run_peers.sh --configs debugmodel-512 --rounds 3
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name -> flavor, layers (0: the flavor's), seq_len, batch per rank, timed steps, warmup steps, rank counts.
CONFIGS = {
    "debugmodel-512": dict(flavor="debugmodel", n_layers=0, seq_len=512, batch=4, steps=5, warmup=1, ranks=[1, 2]),
    "debugmodel-2048": dict(flavor="debugmodel", n_layers=0, seq_len=2048, batch=1, steps=4, warmup=1, ranks=[1, 2]),
    "100M-512": dict(flavor="100M", n_layers=0, seq_len=512, batch=2, steps=3, warmup=1, ranks=[1, 2]),
    # ~1B: Llama 3.2 1B's shape (D 2048, FFN 8192, 32/8 heads, V 128256, untied as torchtitan 0.2.2's
    # Transformer has no tying) with 8 of its 16 blocks: 1.01B parameters, 16.2 GB of fp32 weights,
    # grads and AdamW moments, the most this 23 GiB machine holds (the whole 1.50B untied needs 24 GB).
    "1B-8L-512": dict(flavor="1B", n_layers=8, seq_len=512, batch=1, steps=3, warmup=1, ranks=[1]),
    # The same shape with 2 blocks (647M) is the one that fits FSDP over 2 ranks (2 processes' shards,
    # gathered 128k-row embedding and output, their gradients and the logits).
    "1B-shape-2L-512": dict(flavor="1B", n_layers=2, seq_len=512, batch=1, steps=3, warmup=1, ranks=[2]),
}
# One GPU (benchmarks/gpu/run.sh): the whole Llama 3.2 1B shape, untied on every side (1.50B parameters,
# 24 GB of fp32 weights, grads and AdamW moments), bf16 autocast. 8B needs 16 B/param x 8.03B = 128 GB of
# the same before activations: it does not fit one 141 GB H200 without sharding or optimizer offload.
CONFIGS["gpu-1B-2048"] = dict(flavor="1B", n_layers=0, seq_len=2048, batch=4, steps=20, warmup=3, ranks=[1])
DEFAULT = ["debugmodel-512", "debugmodel-2048", "100M-512", "1B-8L-512", "1B-shape-2L-512"]
SMOKE = dict(flavor="debugmodel", n_layers=1, seq_len=32, batch=1, steps=2, warmup=0, ranks=[1, 2])
SIDES = ["titan", "torchtitan", "eager"]
FIELDS = ["side", "flavor", "n_layers", "params", "batch", "seq_len", "ranks", "threads", "step_times",
          "step_time_min", "step_time_median", "step_time_max", "tps", "losses", "flops_per_token",
          "mfu_declared", "peak_memory_bytes"]


def command(side, cfg, ranks, build, python, out, device):
    threads = 2 // ranks if device == "cpu" else 0
    common = ["--device", device, "--flavor", cfg["flavor"], "--n-layers", str(cfg["n_layers"]), "--seq-len", str(cfg["seq_len"]),
              "--batch", str(cfg["batch"]), "--steps", str(cfg["steps"]), "--warmup", str(cfg["warmup"]),
              "--threads", str(threads), "--json", out]
    if side == "titan":
        program = [os.path.join(build, "bin", "bench_step_throughput")] + common + ["--tie-embeddings", "0"]
        if ranks == 1:
            return program
        return [os.path.join(build, "bin", "titan-run"), "--nproc-per-node", str(ranks)] + program
    peer = [os.path.join(HERE, "peer_step.py"), "--model", side] + common
    if ranks == 1:
        return [python] + peer
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] + peer


def run(side, cfg, ranks, o, out):
    env = dict(os.environ)
    if o.device == "cpu":
        env.update(OMP_NUM_THREADS=str(2 // ranks), MKL_NUM_THREADS=str(2 // ranks))
    cmd = command(side, cfg, ranks, o.build, o.python, out, o.device)
    print("+ " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd), flush=True)
    if o.dry_run:
        return None
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [l for l in p.stdout.splitlines() if side + ":" in l]
    print("\n".join(lines) if p.returncode == 0 else p.stdout[-4000:], flush=True)
    if p.returncode != 0:
        raise SystemExit(f"[compare] expected {side} to exit 0, got {p.returncode}. The output above says why.")
    with open(out) as f:
        result = json.load(f)
    missing = [k for k in FIELDS if k not in result]
    if missing or len(result["losses"]) != cfg["warmup"] + cfg["steps"] or result["ranks"] != ranks:
        raise SystemExit(f"[compare] expected {side}'s JSON to have {FIELDS} with one loss per step and "
                         f"ranks={ranks}, got missing={missing} losses={result.get('losses')}.")
    return result


def summarise(name, cfg, ranks, results):
    """One table row from the rounds of one configuration and rank count."""
    row = dict(config=name, ranks=ranks, threads_per_rank=2 // ranks, seq_len=cfg["seq_len"], batch=cfg["batch"])
    for side in SIDES:
        rs = results[side]
        steps = sorted(t for r in rs for t in r["step_times"])
        row[side] = dict(tps=statistics.median(r["tps"] for r in rs), step_min=steps[0],
                         step_median=statistics.median(steps), step_max=steps[-1], params=rs[0]["params"],
                         loss_first=rs[0]["losses"][0], loss_last=rs[0]["losses"][-1],
                         peak_memory_gib=max(r["peak_memory_bytes"] for r in rs) / 2**30,
                         mfu_declared=statistics.median(r["mfu_declared"] for r in rs))
    titan = results["titan"]
    row["titan_mfu_vs_gemm"] = statistics.median(r["mfu_gemm"] for r in titan)
    row["gemm_peak_gflops"] = statistics.median(r["gemm_peak_flops"] for r in titan) / 1e9
    # The peers declare no CPU peak; measure them against titan's (the FMA peak of the same threads).
    declared = statistics.median(r["tflops"] * 1e12 * 100 / r["mfu_declared"] for r in titan if r["mfu_declared"] > 0) \
        if any(r["mfu_declared"] > 0 for r in titan) else 0.0
    for side in SIDES:
        if row[side]["mfu_declared"] == 0 and declared:
            row[side]["mfu_declared"] = 100 * row[side]["tps"] * results[side][0]["flops_per_token"] / declared
    gemm = row["gemm_peak_gflops"] * 1e9
    for side in SIDES:  # every side against the GEMM rate titan measured in the same round
        row[side]["mfu_vs_gemm"] = 100 * row[side]["tps"] * results[side][0]["flops_per_token"] / gemm if gemm else 0.0
    row["titan_over_torchtitan"] = row["titan"]["tps"] / row["torchtitan"]["tps"]
    row["titan_over_eager"] = row["titan"]["tps"] / row["eager"]["tps"]
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(DEFAULT), help="comma-separated names from: " + ", ".join(CONFIGS))
    p.add_argument("--ranks", default="", help="restrict to these rank counts, e.g. 1 or 1,2")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json", default="", help="result file (default: <build>/peers/result.json)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--smoke", action="store_true", help="one-layer model, 2 steps, 1 round: a quick check")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--summarise", default="", help="print the table of an earlier (or interrupted) run's "
                   "per-run JSON directory (the 'titan-peers-*' temporary directory) instead of running")
    o = p.parse_args()
    configs = {"smoke": SMOKE} if o.smoke else {n: CONFIGS[n] for n in o.configs.split(",")}
    rounds = 1 if o.smoke else o.rounds
    only = [int(r) for r in o.ranks.split(",")] if o.ranks else None
    if o.summarise:
        work = o.summarise
    elif o.dry_run:  # nothing is written: name the folder a run would create
        work = os.path.join(tempfile.gettempdir(), "titan-peers-XXXXXXXX")
    else:
        work = tempfile.mkdtemp(prefix="titan-peers-")
    print(f"per-run results in {work}", flush=True)
    rows = []
    for name, cfg in configs.items():
        for ranks in cfg["ranks"]:
            if only and ranks not in only:
                continue
            results = {s: [] for s in SIDES}
            for r in range(rounds):
                for side in SIDES:
                    out = os.path.join(work, f"{name}_{ranks}r_{side}_{r}.json")
                    if not o.summarise:
                        results[side].append(run(side, cfg, ranks, o, out))
                    elif os.path.exists(out):
                        with open(out) as f:
                            results[side].append(json.load(f))
            if o.summarise and not all(results.values()):
                continue
            if not o.dry_run:
                rows.append(summarise(name, cfg, ranks, results))
    if o.dry_run:
        return
    print("\n| config | ranks x threads | S | B/rank | titan tok/s/rank | torchtitan+FSDP2 tok/s | eager tok/s "
          "| titan/torchtitan | titan/eager | titan step min/med/max s | torchtitan step min/med/max s "
          "| MFU vs GEMM peak titan / torchtitan / eager | MFU titan / torchtitan / eager | peak mem GiB titan / torchtitan / eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in rows:
        t, tt, e = w["titan"], w["torchtitan"], w["eager"]
        print(f"| {w['config']} | {w['ranks']} x {w['threads_per_rank']} | {w['seq_len']} | {w['batch']} "
              f"| {t['tps']:,.0f} | {tt['tps']:,.0f} | {e['tps']:,.0f} | {w['titan_over_torchtitan']:.2f} "
              f"| {w['titan_over_eager']:.2f} | {t['step_min']:.2f} / {t['step_median']:.2f} / {t['step_max']:.2f} "
              f"| {tt['step_min']:.2f} / {tt['step_median']:.2f} / {tt['step_max']:.2f} "
              f"| {t['mfu_vs_gemm']:.0f}% / {tt['mfu_vs_gemm']:.0f}% / {e['mfu_vs_gemm']:.0f}% "
              f"of {w['gemm_peak_gflops']:.0f} GFLOP/s "
              f"| {t['mfu_declared']:.1f}% / {tt['mfu_declared']:.1f}% / {e['mfu_declared']:.1f}% "
              f"| {t['peak_memory_gib']:.2f} / {tt['peak_memory_gib']:.2f} / {e['peak_memory_gib']:.2f} |")
    path = o.json or os.path.join(o.build, "peers", "result.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       load_average=os.getloadavg(), rounds=rounds, rows=rows), f, indent=2)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
