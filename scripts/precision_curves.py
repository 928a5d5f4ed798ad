#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Loss curves of the debug model in fp32, bf16 mixed precision and float8 (tensorwise, rowwise,
rowwise_with_gw_hp), written as one small CSV (docs/assets/precision_curves.csv).

Every mode trains the same job with build/bin/train_llama3: the debug model (dims 256/768, vocabulary
2,048 of the tests' BPE tokenizer: every Linear's dims divisible by 16) on tinyshakespeare, B 4 x S 64,
seed 42, one intra-op thread, deterministic, no activation checkpointing, lr warmup 2 steps then stable
then linear decay over the last 80% of the schedule. It is tests/train/train_test_util.hpp's
short_precision_job; tests/train/precision_curves_test.cpp checks the CSV's claims against a fresh run of
its first steps. float8 filters the output head as torchtitan's job files do (42 of 43 Linears convert).

    scripts/precision_curves.py                      # 200 steps, all modes (~15 min on 2 cores: bf16 is slow here)
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


def job(build, steps, dump):
    return ["--model.flavor", "debugmodel", "--model.hf_assets_path", os.path.join(build, "tests/assets/tokenizer"),
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
    cmd = [os.path.join(build, "bin", "train_llama3")] + job(build, steps, dump) + MODES[mode]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit(f"[precision_curves] expected {mode} to train, got exit {p.returncode}:\n{p.stdout[-3000:]}")
    try:
        losses = read_losses(dump, steps)
    except ValueError as e:
        raise SystemExit(f"[precision_curves] {mode}: {e}")
    print(f"{mode}: {losses[0]:.5f} -> {losses[-1]:.5f}", flush=True)
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--jobs", type=int, default=2, help="modes trained at once (each on one thread)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs/assets/precision_curves.csv"))
    o = p.parse_args()
    modes = o.modes.split(",")
    if "fp32" not in modes or any(m not in MODES for m in modes):
        raise SystemExit(f"[precision_curves] expected --modes from {list(MODES)} including fp32, got {modes}")
    with tempfile.TemporaryDirectory(prefix="titan-curves-") as work:
        # bf16 first: it is the slow one on CPUs without bf16 dot products.
        order = sorted(modes, key=lambda m: m != "bf16")
        with concurrent.futures.ThreadPoolExecutor(o.jobs) as pool:
            curves = dict(zip(order, pool.map(lambda m: train(o.build, o.steps, m, work), order)))
    os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)
    with open(o.out, "w") as f:
        f.write("step," + ",".join(modes) + "\n")
        for s in range(o.steps):
            f.write(f"{s + 1}," + ",".join(f"{curves[m][s]:.6f}" for m in modes) + "\n")
    print(f"wrote {o.out}")
    print("| mode | max abs(loss - fp32) | at step | mean abs over steps | final loss |")
    print("| --- | --- | --- | --- | --- |")
    for m in modes:
        d = [abs(a - b) for a, b in zip(curves[m], curves["fp32"])]
        at = max(range(len(d)), key=d.__getitem__)
        print(f"| {m} | {d[at]:.4f} | {at + 1} | {sum(d) / len(d):.4f} | {curves[m][-1]:.4f} |")


if __name__ == "__main__":
    sys.exit(main())
