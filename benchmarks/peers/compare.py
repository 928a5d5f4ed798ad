# SPDX-License-Identifier: BSD-3-Clause
"""titan vs the Python peers, alternately in one invocation: for each configuration and round it runs
titan's step (bench_step_throughput; 2 ranks: titan-run processes, FSDP over Gloo), torchtitan's Llama 3
from the pip package (peer_step.py --model torchtitan; 2 ranks: torchrun processes, torchtitan's
apply_fsdp = FSDP2 over Gloo), the same model under torch.compile (side `torchtitan-compile`: peer_step.py
--model torchtitan --compile, each block compiled with fullgraph=True before fully_shard, as torchtitan's
apply_compile) and the plain eager model (peer_step.py --model eager; 2 ranks: FSDP2 with the same units).
Same flavor, batch per rank, sequence length, precision, AdamW and clipping on every side. `--sides` picks
the sides (titan always runs).

Made to compare like with like:
- FSDP reshard rule: titan runs `--reshard-after-forward always` (embeddings and every block resharded after
  forward, norm + output kept), which is torchtitan 0.2.2's `apply_fsdp` default; titan's own `default`
  also keeps the last block gathered.
- Precision (`--precisions fp32,bf16,float8`): bf16 is autocast on one rank and FSDP2's
  MixedPrecisionPolicy(bf16, fp32) on two, on every side; float8 is the tensorwise recipe on every Linear but
  the output head (torchao's convert_to_float8_training on the Python sides).
- Step-1 losses: every side draws the same tokens (each rank seeds the CPU generator with its rank and draws
  input then labels) and initialises at torchtitan's scales (different draws), so their first losses must
  agree within sampling noise (--loss-tolerance, default 6 / sqrt(global tokens)); the run stops with an
  error when they do not.
- Memory: each side reports its training state's bytes (parameters, gradients, optimizer state of rank 0)
  and the allocator peak of one extra step (titan's allocator tracker; the torch profiler's memory events
  on the Python sides), next to the process's peak RSS.
- Compile time: the compiled side compiles in its first warm-up step (it gets at least one, also under
  --smoke), so its timed steps exclude compilation; the table states that first step's excess over a timed
  step (peer_step.py's compile_s, median over rounds) in its own column. Every compiled run gets a fresh
  inductor cache folder (TORCHINDUCTOR_CACHE_DIR under the per-run folder), so the figure is a cold compile.
  Inductor on CPU needs a C++ compiler (g++) at run time.
- `--ablate-overlap` adds titan with `--overlap 0` (no FSDP prefetch, every reduce-scatter waited where it
  is issued) at 2 ranks: how much of titan's lead is its communication overlap.

Threads: 1 rank uses 2 intra-op threads, 2 ranks 1 each (2 cores in all), set three ways on every side:
OMP_NUM_THREADS and MKL_NUM_THREADS in the environment, and --threads N, which calls at::set_num_threads
(titan) or torch.set_num_threads (peers).

Prints each run, then a table of tokens/s per rank (median over rounds), step time min/median/max over all
timed steps of all rounds, the ratio titan/peer and titan's model FLOP/s as a share of the fp32 GEMM rate
measured in the same titan process; writes everything to --json. `--smoke` runs a one-layer model for two
steps (the ctest: checks that every side trains and the JSON has its fields); it leaves the compiled side
out unless `--sides` names it (a cold compile costs tens of seconds per run on 2 cores).

    benchmarks/peers/run_peers.sh                      # the docs/performance.md table
    benchmarks/peers/run_peers.sh --configs debugmodel-512 --rounds 3
    benchmarks/peers/run_peers.sh --configs debugmodel-128 --precisions fp32,bf16,float8 \
        --sides titan,torchtitan,torchtitan-compile    # eager vs compiled torchtitan, compile time stated
    benchmarks/peers/run_peers.sh --smoke --sides titan,torchtitan-compile   # the compiled side's quick check
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
# Llama 3 8B's shape (D 4096, FFN 14336, 32/8 heads, V 128256) with 8 of its 32 blocks: 2.80B parameters,
# 45 GB of fp32 weights, grads and AdamW moments, which leaves one H100/H200 room for the activations.
CONFIGS["gpu-8B-8L-2048"] = dict(flavor="8B", n_layers=8, seq_len=2048, batch=2, steps=20, warmup=3, ranks=[1])
DEFAULT = ["debugmodel-512", "debugmodel-2048", "100M-512", "1B-8L-512", "1B-shape-2L-512"]
SMOKE = dict(flavor="debugmodel", n_layers=1, seq_len=32, batch=1, steps=2, warmup=0, ranks=[1, 2])
SMOKE_SIDES = ["titan", "torchtitan", "eager"]  # --smoke's default: the compiled side only when --sides names it
# Small shapes for the precision comparison: bf16 GEMMs are 40-140x slower than fp32 on CPUs without
# AVX512-BF16/AMX (docs/performance.md), so bf16 steps of the configurations above would take minutes.
CONFIGS["debugmodel-128"] = dict(flavor="debugmodel", n_layers=0, seq_len=128, batch=2, steps=2, warmup=1, ranks=[1, 2])
CONFIGS["100M-128"] = dict(flavor="100M", n_layers=0, seq_len=128, batch=1, steps=1, warmup=1, ranks=[1, 2])
SIDES = ["titan", "torchtitan", "torchtitan-compile", "eager"]  # also the order of the table's "a / b / c / d" cells
PEER_FLAGS = {"torchtitan": ["--model", "torchtitan"], "torchtitan-compile": ["--model", "torchtitan", "--compile"],
              "eager": ["--model", "eager"]}
PRECISIONS = {"fp32": [], "bf16": ["--mixed-precision", "bf16"], "float8": ["--float8", "tensorwise"]}
FIELDS = ["side", "flavor", "n_layers", "params", "batch", "seq_len", "ranks", "threads", "step_times",
          "step_time_min", "step_time_median", "step_time_max", "tps", "losses", "flops_per_token",
          "mfu_declared", "peak_memory_bytes", "state_bytes", "step_peak_bytes"]


def warmup(side, cfg):
    """A compiled side compiles in its first step, which must be a warm-up step."""
    return max(1, cfg["warmup"]) if side.endswith("-compile") else cfg["warmup"]


def command(side, cfg, ranks, build, python, out, device, precision="fp32"):
    threads = 2 // ranks if device == "cpu" else 0
    common = ["--device", device, "--flavor", cfg["flavor"], "--n-layers", str(cfg["n_layers"]), "--seq-len", str(cfg["seq_len"]),
              "--batch", str(cfg["batch"]), "--steps", str(cfg["steps"]), "--warmup", str(warmup(side, cfg)),
              "--threads", str(threads), "--json", out] + PRECISIONS[precision]
    if side.startswith("titan"):
        # torchtitan 0.2.2's apply_fsdp rule (titan's "always"); titan_no_overlap: the overlap ablation.
        program = [os.path.join(build, "bin", "bench_step_throughput")] + common + [
            "--tie-embeddings", "0", "--reshard-after-forward", "always"]
        if side == "titan_no_overlap":
            program += ["--overlap", "0"]
        if ranks == 1:
            return program
        return [os.path.join(build, "bin", "titan-run"), "--nproc-per-node", str(ranks)] + program
    peer = [os.path.join(HERE, "peer_step.py")] + PEER_FLAGS[side] + common
    if ranks == 1:
        return [python] + peer
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] + peer


def run(side, cfg, ranks, o, out, precision):
    env = dict(os.environ)
    if o.device == "cpu":
        env.update(OMP_NUM_THREADS=str(2 // ranks), MKL_NUM_THREADS=str(2 // ranks))
    cmd = command(side, cfg, ranks, o.build, o.python, out, o.device, precision)
    print("+ " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd), flush=True)
    if o.dry_run:
        return None
    if side.endswith("-compile"):  # a cold compile every run: its compile_s does not depend on earlier runs
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.splitext(out)[0] + "_inductor"
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tag = "titan" if side.startswith("titan") else side
    lines = [l for l in p.stdout.splitlines() if tag + ":" in l]
    print("\n".join(lines) if p.returncode == 0 else p.stdout[-4000:], flush=True)
    if p.returncode != 0:
        raise SystemExit(f"[compare] expected {side} to exit 0, got {p.returncode}. The output above says why.")
    with open(out) as f:
        result = json.load(f)
    missing = [k for k in FIELDS if k not in result]
    if missing or len(result["losses"]) != warmup(side, cfg) + cfg["steps"] or result["ranks"] != ranks:
        raise SystemExit(f"[compare] expected {side}'s JSON to have {FIELDS} with one loss per step and "
                         f"ranks={ranks}, got missing={missing} losses={result.get('losses')}.")
    return result


def check_first_losses(results, tolerance, what):
    """Every side's step-1 loss against titan's, round by round: the same tokens at the same init scale."""
    for r, titan in enumerate(results["titan"]):
        for side, rs in results.items():
            if side == "titan" or r >= len(rs):
                continue
            if titan.get("data_checksum") != rs[r].get("data_checksum"):
                raise SystemExit(f"[compare] expected {side} to train on titan's tokens on {what}, got data checksum "
                                 f"{rs[r].get('data_checksum')} vs titan {titan.get('data_checksum')}.")
            a, b = titan["losses"][0], rs[r]["losses"][0]
            if not abs(a - b) <= tolerance:
                raise SystemExit(f"[compare] expected {side}'s step-1 loss within {tolerance} of titan's on {what} "
                                 f"(same tokens, same init scale), got {b:.5f} vs titan {a:.5f}.")


def summarise(name, cfg, ranks, results, precision="fp32"):
    """One table row from the rounds of one configuration, rank count and precision."""
    sides = [s for s in results if results[s]]
    row = dict(config=name, ranks=ranks, threads_per_rank=2 // ranks, seq_len=cfg["seq_len"], batch=cfg["batch"],
               precision=precision, sides=sides)
    for side in sides:
        rs = results[side]
        steps = sorted(t for r in rs for t in r["step_times"])
        row[side] = dict(tps=statistics.median(r["tps"] for r in rs), step_min=steps[0],
                         step_median=statistics.median(steps), step_max=steps[-1], params=rs[0]["params"],
                         loss_first=rs[0]["losses"][0], loss_last=rs[0]["losses"][-1],
                         peak_memory_gib=max(r["peak_memory_bytes"] for r in rs) / 2**30,
                         state_gib=max(r.get("state_bytes", 0) for r in rs) / 2**30,
                         step_peak_gib=max(r.get("step_peak_bytes", 0) for r in rs) / 2**30,
                         mfu_declared=statistics.median(r["mfu_declared"] for r in rs),
                         compile_s=statistics.median(r.get("compile_s", 0.0) for r in rs),
                         first_step_s=statistics.median(r.get("first_step_s", 0.0) for r in rs))
    titan = results["titan"]
    row["titan_mfu_vs_gemm"] = statistics.median(r["mfu_gemm"] for r in titan)
    row["gemm_peak_gflops"] = statistics.median(r["gemm_peak_flops"] for r in titan) / 1e9
    # The peers declare no CPU peak; measure them against titan's (the FMA peak of the same threads).
    declared = statistics.median(r["tflops"] * 1e12 * 100 / r["mfu_declared"] for r in titan if r["mfu_declared"] > 0) \
        if any(r["mfu_declared"] > 0 for r in titan) else 0.0
    for side in sides:
        if row[side]["mfu_declared"] == 0 and declared:
            row[side]["mfu_declared"] = 100 * row[side]["tps"] * results[side][0]["flops_per_token"] / declared
    gemm = row["gemm_peak_gflops"] * 1e9
    for side in sides:  # every side against the GEMM rate titan measured in the same round
        row[side]["mfu_vs_gemm"] = 100 * row[side]["tps"] * results[side][0]["flops_per_token"] / gemm if gemm else 0.0
    for side in sides:
        if side != "titan":
            row[f"titan_over_{side}"] = row["titan"]["tps"] / row[side]["tps"]
    return row


def fmt_row(w):
    """The row in docs/performance.md's form; '-' for a side that did not run."""
    sides = w["sides"]
    def get(side, key, f):
        return f.format(w[side][key]) if side in sides else "-"
    def ratio(side):
        return f"{w['titan_over_' + side]:.2f}" if side in sides else "-"
    def every(key, f):  # one value per side of SIDES, in its order
        return " / ".join(get(s, key, f) for s in SIDES)
    peers = " | ".join(get(s, "tps", "{:,.0f}") for s in SIDES[1:])
    ratios = " | ".join(ratio(s) for s in SIDES[1:])
    return (f"| {w['config']} | {w['ranks']} x {w['threads_per_rank']} | {w.get('precision', 'fp32')} | {w['seq_len']} "
            f"| {w['batch']} | {get('titan', 'tps', '{:,.0f}')} | {peers} | {ratios} "
            f"| {get('titan_no_overlap', 'tps', '{:,.0f}')} | {get('torchtitan-compile', 'compile_s', '{:.1f}')} "
            f"| {every('step_median', '{:.2f}')} | {every('mfu_vs_gemm', '{:.0f}%')} of {w['gemm_peak_gflops']:.0f} "
            f"| {every('loss_first', '{:.4f}')} | {every('state_gib', '{:.3f}')} | {every('step_peak_gib', '{:.3f}')} "
            f"| {every('peak_memory_gib', '{:.2f}')} |")


ALL = " / ".join(SIDES)
HEADER = ("| config | ranks x threads | precision | S | B/rank | titan tok/s/rank | "
          + " | ".join(f"{s} tok/s/rank" for s in SIDES[1:]) + " | "
          + " | ".join(f"titan/{s}" for s in SIDES[1:])
          + f" | titan no-overlap tok/s/rank | torchtitan-compile compile s (untimed first step minus a timed step) | median step s {ALL} "
          f"| MFU vs titan's measured GEMM peak (GFLOP/s) {ALL} | step-1 loss {ALL} | training state GiB {ALL} "
          f"| step allocator peak GiB {ALL} | peak RSS GiB {ALL} |\n" + "| --- " * 20 + "|")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


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
    p.add_argument("--precisions", default="fp32", help="comma-separated from: " + ", ".join(PRECISIONS))
    p.add_argument("--sides", default="", help="comma-separated from: " + ", ".join(SIDES) +
                   " (titan always runs; default: all of them, and under --smoke " + ",".join(SMOKE_SIDES) + ")")
    p.add_argument("--ablate-overlap", action="store_true",
                   help="also run titan with --overlap 0 at 2 ranks (no FSDP prefetch, reduce-scatters waited at once)")
    p.add_argument("--loss-tolerance", type=float, default=0.0,
                   help="largest allowed |step-1 loss - titan's| of another side (0: 6 / sqrt(global tokens))")
    p.add_argument("--work", default="", help="per-run JSON directory to write into (default: a new temporary one);"
                   " a driver that splits a run into several invocations passes one and --summarise's it at the end")
    p.add_argument("--summarise", default="", help="print the table of an earlier (or interrupted) run's "
                   "per-run JSON directory (the 'titan-peers-*' temporary directory) instead of running")
    o = p.parse_args()
    configs = {"smoke": SMOKE} if o.smoke else {n: CONFIGS[n] for n in o.configs.split(",")}
    rounds = 1 if o.smoke else o.rounds
    only = [int(r) for r in o.ranks.split(",")] if o.ranks else None
    if o.summarise:
        work = o.summarise
    elif o.work:
        work = o.work
        os.makedirs(work, exist_ok=True)
    elif o.dry_run:  # nothing is written: name the folder a run would create
        work = os.path.join(tempfile.gettempdir(), "titan-peers-XXXXXXXX")
    else:
        work = tempfile.mkdtemp(prefix="titan-peers-")
    print(f"per-run results in {work}; {cpu_model()}; load average {os.getloadavg()}", flush=True)
    chosen = o.sides or ",".join(SMOKE_SIDES if o.smoke else SIDES)
    sides = ["titan"] + [s for s in chosen.split(",") if s and s != "titan"]
    if any(s not in SIDES for s in sides):
        raise SystemExit(f"[compare] expected --sides from {SIDES}, got {o.sides}")
    precisions = o.precisions.split(",")
    if any(pr not in PRECISIONS for pr in precisions):
        raise SystemExit(f"[compare] expected --precisions from {list(PRECISIONS)}, got {o.precisions}")
    rows = []
    for name, cfg in configs.items():
        for ranks in cfg["ranks"]:
            if only and ranks not in only:
                continue
            for precision in precisions:
                run_sides = sides + (["titan_no_overlap"] if o.ablate_overlap and ranks > 1 else [])
                results = {s: [] for s in run_sides}
                for r in range(rounds):
                    for side in run_sides:
                        suffix = "" if precision == "fp32" else "_" + precision
                        out = os.path.join(work, f"{name}_{ranks}r{suffix}_{side}_{r}.json")
                        if not o.summarise:
                            results[side].append(run(side, cfg, ranks, o, out, precision))
                        elif os.path.exists(out):
                            with open(out) as f:
                                results[side].append(json.load(f))
                if o.summarise and not all(results.values()):
                    continue
                if not o.dry_run:
                    # The sides' weights are different draws at the same scales, so their step-1 losses differ
                    # by sampling: per-token losses have a standard deviation of about 1 at init, the mean over
                    # T tokens about sqrt(2 / T) between two sides; 6 / sqrt(T) is over 4 of those. A side at
                    # another init scale (torch's default Linear init: -0.3) or on other tokens fails it.
                    tokens = cfg["batch"] * cfg["seq_len"] * ranks
                    check_first_losses(results, o.loss_tolerance or 6 / tokens ** 0.5,
                                       f"{name} {ranks} ranks {precision}")
                    rows.append(summarise(name, cfg, ranks, results, precision))
    if o.dry_run:
        return
    print("\n" + HEADER)
    for w in rows:
        print(fmt_row(w))
    path = o.json or os.path.join(o.build, "peers", "result.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       load_average=os.getloadavg(), machine=cpu_model(), rounds=rounds, rows=rows), f, indent=2)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
