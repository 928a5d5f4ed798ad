#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Loss curves of the debug model in fp32, bf16 mixed precision and float8 (tensorwise, rowwise,
rowwise_with_gw_hp), written as one small CSV (docs/assets/precision_curves.csv), a golden file: it changes
only by a regeneration committed alone (scripts/check_golden_commits.py), with the message this prints.

Every mode trains the same job with build/bin/train_llama3: the debug model (dims 256/768, vocabulary
2,048 of the tests' BPE tokenizer: every Linear's dims divisible by 16) on tinyshakespeare, B 4 x S 64,
seed 42, one intra-op thread, deterministic, no activation checkpointing, lr warmup 2 steps then stable
then linear decay over the last 80% of a 200-step schedule (--steps cuts it short, on the same learning
rates). float8 filters the output head as torchtitan's job files do (42 of 43 Linears convert).

Every run takes PINNED's environment: the same arithmetic on every x86-64 CPU with AVX2 (docs/
mixed_precision.md, "Loss curves"), so tests/train/precision_curves_test.cpp reruns this script and
requires the CSV to 6 decimals.

    scripts/precision_curves.py                      # 200 steps, all modes (~10 min on 2 cores)
    scripts/precision_curves.py --modes fp32,float8_tensorwise --steps 20 --out /tmp/c.csv
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSV = os.path.join(ROOT, "docs/assets/precision_curves.csv")
SCHEDULE_STEPS = 200  # the curves' length: the learning-rate schedule of every run, however many steps it runs
# What the arithmetic of a run depends on besides titan, fixed to what every x86-64 CPU with AVX2 does alike:
PINNED = {
    "OMP_NUM_THREADS": "1",  # one thread: sums split the same way
    "MKL_NUM_THREADS": "1",
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's AVX2 kernels, also where the CPU has AVX-512
    "MKL_CBWR": "COMPATIBLE",  # MKL's one GEMM code path for Intel and AMD CPUs alike (its other paths are
                               # per vendor and ISA)
    "TITAN_BF16_GEMM": "widened",  # bf16 GEMMs as fp32 GEMMs of the bf16 values, not oneDNN's per-ISA kernel
}
MODES = {
    "fp32": [],
    "bf16": ["--training.mixed_precision_param", "bfloat16"],
    "float8_tensorwise": ["--model.converters", "float8", "--float8.recipe_name", "tensorwise",
                          "--float8.filter_fqns", "output"],
    "float8_rowwise": ["--model.converters", "float8", "--float8.recipe_name", "rowwise",
                       "--float8.filter_fqns", "output"],
    "float8_rowwise_with_gw_hp": ["--model.converters", "float8", "--float8.recipe_name", "rowwise_with_gw_hp",
                                  "--float8.filter_fqns", "output"],
}


def job(build, steps, dump, schedule_steps=None):
    """train_llama3's flags for the curves' job; schedule_steps sets the learning-rate schedule's length."""
    schedule = ["--lr_scheduler.total_steps", str(schedule_steps)] if schedule_steps else []
    return schedule + ["--model.flavor", "debugmodel", "--model.hf_assets_path", os.path.join(build, "tests/assets/tokenizer"),
            "--training.dataset", "tinyshakespeare",
            "--training.dataset_path", os.path.join(ROOT, "tests/assets/tinyshakespeare/input.txt"),
            "--training.seq_len", "64", "--training.local_batch_size", "4", "--training.steps", str(steps),
            "--training.num_threads", "1", "--debug.seed", "42", "--debug.deterministic", "true",
            "--lr_scheduler.warmup_steps", "2", "--lr_scheduler.decay_ratio", "0.8",
            "--activation_checkpoint.mode", "none", "--metrics.log_freq", "1",
            "--metrics.disable_color_printing", "true", "--checkpoint.enable", "false", "--job.dump_folder", dump]


def read_losses(dump, steps):
    """Step 1..steps -> loss from <dump>/metrics.jsonl; ValueError unless every step has exactly its line."""
    losses = {}
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss_metrics/global_avg_loss" in r:
                losses[r["step"]] = r["loss_metrics/global_avg_loss"]
    if sorted(losses) != list(range(1, steps + 1)):
        raise ValueError(f"expected one loss per step 1..{steps} in {dump}/metrics.jsonl, got steps {sorted(losses)}")
    return [losses[s] for s in range(1, steps + 1)]


def train(build, steps, mode, work):
    dump = os.path.join(work, mode)
    cmd = [os.path.join(build, "bin", "train_llama3")] + job(build, steps, dump, SCHEDULE_STEPS) + MODES[mode]
    env = dict(os.environ, **PINNED)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit(f"[precision_curves] expected {mode} to train, got exit {p.returncode}:\n{p.stdout[-3000:]}")
    try:
        losses = read_losses(dump, steps)
    except ValueError as e:
        raise SystemExit(f"[precision_curves] {mode}: {e}")
    print(f"{mode}: {losses[0]:.5f} -> {losses[-1]:.5f}", flush=True)
    return losses


def read_csv(path):
    """mode -> losses of steps 1..N from a curves CSV."""
    with open(path) as f:
        rows = [line.strip().split(",") for line in f if line.strip()]
    return {m: [float(r[c]) for r in rows[1:]] for c, m in enumerate(rows[0]) if c > 0}


def cpu_model():
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")


def changes(old, new):
    """The regeneration's printout: each mode's first and last step old -> new, and max |new - old|."""
    lines, worst = [], 0.0
    for m, curve in new.items():
        before = old.get(m, [])
        d = [abs(a - b) for a, b in zip(curve, before)] if len(before) == len(curve) else [float("inf")]
        worst = max(worst, max(d))
        first, last = (f"{before[i]:.6f}" if len(before) == len(curve) else "-" for i in (0, -1))
        lines.append(f"{m}: step 1 {first} -> {curve[0]:.6f}, step {len(curve)} {last} -> {curve[-1]:.6f}, "
                     f"max |new - old| {max(d):.6f}")
    return "\n".join(lines + [f"max |new - old|: {worst:.6f}"])


def tables(curves, shown=(1, 10, 50, 100, 150, 200)):
    """docs/mixed_precision.md's two tables of the curves: losses at selected steps, distances from fp32."""
    modes = list(curves)
    steps = [s for s in shown if s <= len(curves["fp32"])]
    out = ["| step | " + " | ".join(modes) + " |", "|---:|" + "---:|" * len(modes)]
    out += [f"| {s} | " + " | ".join(f"{curves[m][s - 1]:.4f}" for m in modes) + " |" for s in steps]
    n = len(curves["fp32"])
    out += ["", f"| mode | max over {n} steps | at step | mean | max over the first 20 |", "|---|---:|---:|---:|---:|"]
    for m in modes[1:]:
        d = [abs(a - b) for a, b in zip(curves[m], curves["fp32"])]
        at = max(range(n), key=d.__getitem__)
        out.append(f"| {m} | {d[at]:.4f} | {at + 1} | {sum(d) / n:.4f} | {max(d[:20]):.4f} |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=SCHEDULE_STEPS)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--jobs", type=int, default=2, help="modes trained at once (each on one thread)")
    p.add_argument("--out", default=CSV)
    p.add_argument("--tables", action="store_true", help="print the docs' tables of --out's curves; train nothing")
    o = p.parse_args()
    if o.tables:
        print(tables(read_csv(o.out)))
        return 0
    modes = o.modes.split(",")
    if "fp32" not in modes or any(m not in MODES for m in modes):
        raise SystemExit(f"[precision_curves] expected --modes from {list(MODES)} including fp32, got {modes}")
    if not 0 < o.steps <= SCHEDULE_STEPS:
        raise SystemExit(f"[precision_curves] expected --steps in 1..{SCHEDULE_STEPS} (the schedule's length), "
                         f"got {o.steps}")
    with tempfile.TemporaryDirectory(prefix="titan-curves-") as work:
        # bf16 first: it is the slow one.
        order = sorted(modes, key=lambda m: m != "bf16")
        with concurrent.futures.ThreadPoolExecutor(o.jobs) as pool:
            curves = dict(zip(order, pool.map(lambda m: train(o.build, o.steps, m, work), order)))
    curves = {m: curves[m] for m in modes}
    old = read_csv(o.out) if os.path.exists(o.out) else {}
    os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)
    # Written aside and renamed: an interrupted run leaves the old file whole.
    with open(o.out + ".tmp", "w") as f:
        f.write("step," + ",".join(modes) + "\n")
        for s in range(o.steps):
            f.write(f"{s + 1}," + ",".join(f"{curves[m][s]:.6f}" for m in modes) + "\n")
    os.replace(o.out + ".tmp", o.out)
    print(f"wrote {o.out} on {cpu_model()}\n")
    print(tables(curves))
    if os.path.abspath(o.out) == CSV:
        print("\nCommit the CSV alone, with this message:\n\n"
              "golden loss curve regenerated: <why the math, data or job changed>\n\n" + changes(old, curves))


if __name__ == "__main__":
    sys.exit(main())
