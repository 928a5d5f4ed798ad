#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The stages of benchmarks/gpu/device_check.sh that train the debug model, generate and compare, and its summary.

Every run is scripts/precision_curves.py's job (the debug model on tinyshakespeare with the tests' BPE tokenizer,
B 4 x S 64, seed 42, deterministic, no activation checkpointing, 20 or 200 steps) with its mode's flags, and names
its compute dtype (training.mixed_precision_param), whose default differs between CPU (fp32) and GPU (bf16). A
run without CUDA_VISIBLE_DEVICES="" trains on the GPU when one is visible.

    device_check.py curves   --build B --results R   fp32, 20 steps, vs the golden CPU curve (tests/assets/losses,
                                                     2e-4 relative: the golden test's bound); fp32, bf16 and
                                                     float8 tensorwise, 200 steps, vs the committed CPU curves
                                                     (docs/assets/precision_curves.csv; 1e-4 for fp32, 0.01 for
                                                     the others: precision_curves_test's bounds between two
                                                     CPUs), and each low-precision mode's distance from this
                                                     device's fp32 within a factor of 2 of the committed one
    device_check.py ac_doc   --build B --results R   per-op activation checkpointing = no AC, bitwise (as on CPU);
                                                     document-masked attention (training.packing document) on the
                                                     device vs the same job on this machine's CPU (2e-4 relative)
    device_check.py generate --build B --results R   titan-generate (greedy) from the 200-step fp32 run's
                                                     checkpoint: the same token ids on the device and on the CPU
    device_check.py snapshot --build B --results R   a CUDA memory snapshot (profiling.enable_memory_snapshot):
                                                     the allocator's pickle, with segments and a trace
    device_check.py summary  --results R --out FILE  the summary: one row per stage (R/stages.tsv, the last
                                                     line of R/<stage>.log) and the throughput table
                                                     (R/throughput_*.json)

--dry-run prints the commands a stage would run ("+ cmd") and runs nothing. A stage prints its verdict as its
last line ("PASS: ..." or "FAIL: ...") and exits 1 on a failed check.
"""
import argparse
import glob
import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import precision_curves  # noqa: E402  (the job and the modes' flags, one source of truth)

STEPS = 20  # the golden curve's
CURVE_STEPS = 200  # docs/assets/precision_curves.csv's
GOLDEN = os.path.join(ROOT, "tests/assets/losses/llama3_debugmodel_cpu.txt")
CURVES_CSV = os.path.join(ROOT, "docs/assets/precision_curves.csv")
FP32 = ["--training.mixed_precision_param", "float32"]
# Each mode with its compute dtype named, so the GPU runs what the CPU curve ran.
MODES = {
    "fp32": precision_curves.MODES["fp32"] + FP32,
    "bf16": precision_curves.MODES["bf16"],
    "float8_tensorwise": precision_curves.MODES["float8_tensorwise"] + FP32,
}
PROMPTS = ["ROMEO:", "To be, or not to be"]


class Runner:
    def __init__(self, o):
        self.o = o
        self.build = os.path.abspath(o.build) if o.build else ""
        self.results = os.path.abspath(o.results)

    def program(self, name):
        return os.path.join(self.build, "bin", name)

    def run(self, cmd, log, cpu=False):
        """Runs cmd (on the CPU when cpu: no GPU visible) with its output in log; returns the output."""
        env_text = 'CUDA_VISIBLE_DEVICES="" ' if cpu else ""
        print(f"+ {env_text}{shlex.join(cmd)} > {log} 2>&1", flush=True)
        if self.o.dry_run:
            return ""
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        with open(log, "w") as f:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            f.write(p.stdout)
        if p.returncode != 0:
            raise Failure(f"{os.path.basename(cmd[0])} exited {p.returncode}; the end of {log}:\n{p.stdout[-2000:]}")
        return p.stdout

    def train(self, name, flags, steps=STEPS, cpu=False):
        """Trains the precision curves' job plus flags into results/<name>; returns its losses by step."""
        dump = os.path.join(self.results, name)
        cmd = [self.program("train_llama3")] + precision_curves.job(self.build, steps, dump) + flags
        if not self.o.dry_run and os.path.isdir(dump):
            shutil.rmtree(dump)  # a rerun starts fresh (the checkpointer would resume)
        self.run(cmd, dump + ".txt", cpu)
        return [] if self.o.dry_run else losses_of(dump, steps)


class Failure(Exception):
    pass


def losses_of(dump, steps):
    try:
        return precision_curves.read_losses(dump, steps)
    except ValueError as e:
        raise Failure(str(e))


def golden_curve():
    with open(GOLDEN) as f:
        return [float(line.split()[1]) for line in f if line.strip() and not line.startswith("#")]


def committed_curve(mode):
    with open(CURVES_CSV) as f:
        header = f.readline().strip().split(",")
        column = header.index(mode)
        return [float(line.split(",")[column]) for line in f]


def max_distance(a, b, relative=False):
    """The largest |a - b| (relative to b) over the steps both have, and the step it is at."""
    d = [abs(x - y) / (abs(y) if relative else 1.0) for x, y in zip(a, b)]
    at = max(range(len(d)), key=d.__getitem__)
    return d[at], at + 1


def within(what, got, ref, bound, relative=False):
    d, at = max_distance(got, ref, relative)
    kind = "relative" if relative else "absolute"
    text = f"{what}: max {kind} difference {d:.3g} at step {at} (bound {bound:g})"
    print(text, flush=True)
    if d > bound:
        raise Failure(text)
    return f"{what} {d:.2g}"


def stage_curves(r):
    golden = r.train("curves/fp32_20", MODES["fp32"])
    # The committed curves are 200-step runs: the learning rate's decay depends on training.steps. fp32's last
    # step is saved for the generate stage.
    saved = {"fp32": ["--checkpoint.enable", "true"]}
    losses = {mode: r.train(f"curves/{mode}", flags + saved.get(mode, []), steps=CURVE_STEPS)
              for mode, flags in MODES.items()}
    if r.o.dry_run:
        return "dry run"
    with open(os.path.join(r.results, "curves.csv"), "w") as f:  # this device's curves, as the committed CSV
        f.write("step," + ",".join(losses) + "\n")
        for s in range(CURVE_STEPS):
            f.write(f"{s + 1}," + ",".join(f"{losses[m][s]:.6f}" for m in losses) + "\n")
    notes = [within("fp32 (20 steps) vs golden CPU curve", golden, golden_curve(), 2e-4, relative=True),
             within("fp32 vs committed CPU curve", losses["fp32"], committed_curve("fp32"), 1e-4)]
    for mode in ("bf16", "float8_tensorwise"):
        notes.append(within(f"{mode} vs committed CPU curve", losses[mode], committed_curve(mode), 0.01))
        # What the docs claim of the mode: its distance from fp32 on one machine, within a factor of 2 of
        # the committed curves' (precision_curves_test's check); a run that silently fell back fails here.
        claimed, _ = max_distance(committed_curve(mode), committed_curve("fp32"))
        here, at = max_distance(losses[mode], losses["fp32"])
        text = f"{mode} vs this device's fp32: max difference {here:.3g} at step {at} (committed {claimed:.3g})"
        print(text, flush=True)
        if not claimed / 2 < here < claimed * 2:
            raise Failure(text + ": expected within a factor of 2 of the committed distance")
    return ", ".join(notes)


def stage_ac_doc(r):
    fp32 = os.path.join(r.results, "curves/fp32_20")
    if not r.o.dry_run and not os.path.isfile(os.path.join(fp32, "metrics.jsonl")):
        raise Failure(f"expected the curves stage's fp32 run in {fp32}, got none: run the curves stage first")
    per_op = ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"]
    ac = r.train("ac_doc/per_op_ac", MODES["fp32"] + per_op)
    document = MODES["fp32"] + ["--training.packing", "document"]
    doc_device = r.train("ac_doc/document", document)
    doc_cpu = r.train("ac_doc/document_cpu", document, cpu=True)
    if r.o.dry_run:
        return "dry run"
    return ", ".join([within("per-op AC vs no AC", ac, losses_of(fp32, STEPS), 0.0),
                      within("document masks, device vs CPU", doc_device, doc_cpu, 2e-4, relative=True)])


def stage_generate(r):
    checkpoint = os.path.join(r.results, "curves/fp32/checkpoint")
    cmd = [r.program("titan-generate"), "--checkpoint", checkpoint, "--model.flavor", "debugmodel",
           "--tokenizer", os.path.join(r.build, "tests/assets/tokenizer"), "--greedy", "--max-new-tokens", "48",
           "--output", "jsonl"]
    for p in PROMPTS:
        cmd += ["--prompt", p]
    outputs = [r.run(cmd, os.path.join(r.results, f"generate_{where}.txt"), cpu=where == "cpu")
               for where in ("device", "cpu")]
    if r.o.dry_run:
        return "dry run"
    rows = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out in outputs]
    ids = [[row["ids"] for row in side] for side in rows]
    if len(ids[0]) != len(PROMPTS) or ids[0] != ids[1]:
        raise Failure(f"expected the same greedy token ids on the device and the CPU, got {ids[0]} and {ids[1]}")
    return f"{sum(len(i) for i in ids[0])} greedy tokens for {len(PROMPTS)} prompts, the same ids on device and CPU"


def stage_snapshot(r):
    dump = os.path.join(r.results, "snapshot")
    r.train("snapshot", MODES["bf16"] + ["--profiling.enable_memory_snapshot", "true", "--profiling.profile_freq", "2"],
            steps=4)
    if r.o.dry_run:
        return "dry run"
    found = sorted(glob.glob(os.path.join(dump, "memory_snapshot", "iteration_*", "rank0_memory_snapshot.pickle")))
    if not found:
        raise Failure(f"expected rank0_memory_snapshot.pickle under {dump}/memory_snapshot, got none")
    with open(found[-1], "rb") as f:
        snapshot = pickle.load(f)
    segments = snapshot.get("segments", [])
    events = sum(len(t) for t in snapshot.get("device_traces", []))
    if not segments or events == 0:
        raise Failure(f"expected segments and trace events in {found[-1]}, got {len(segments)} and {events}")
    shutil.copy(found[-1], os.path.join(r.results, "memory_snapshot.pickle"))
    reserved = sum(s.get("total_size", 0) for s in segments) / 2**30
    step = os.path.basename(os.path.dirname(found[-1]))
    return f"{len(segments)} segments ({reserved:.2f} GiB reserved), {events} trace events ({step})"


def summary(o):
    """The summary as Markdown: the stages with their verdicts, then the throughput table."""
    results = os.path.abspath(o.results)
    lines = ["# titan device check", ""]
    info = os.path.join(results, "machine.txt")
    if os.path.isfile(info):
        lines += [f"    {line.rstrip()}" for line in open(info)] + [""]
    lines += ["| stage | result | seconds | detail |", "| --- | --- | --- | --- |"]
    with open(os.path.join(results, "stages.tsv")) as f:
        for row in f:
            name, status, seconds = row.rstrip("\n").split("\t")
            detail = ""
            log = os.path.join(results, f"{name}.log")
            if os.path.isfile(log):
                tail = [line.strip() for line in open(log, errors="replace") if line.strip()]
                detail = tail[-1][:300].replace("|", "/") if tail else ""
            lines.append(f"| {name} | {status} | {seconds} | {detail} |")
    rows = []
    for path in sorted(glob.glob(os.path.join(results, "throughput_*.json"))):
        with open(path) as f:
            j = json.load(f)
        precision = j["mixed_precision"] + ("" if j["float8"] == "none" else f" + float8 {j['float8']}")
        rows.append(f"| {j['flavor']} ({j['n_layers']} layers, {j['params'] / 1e9:.2f}B) | {precision} | "
                    f"{j['batch']} x {j['seq_len']} | {j['tps']:.0f} | {j['tflops']:.1f} | {j['mfu_declared']:.1f}% | "
                    f"{j['peak_memory_bytes'] / 2**30:.1f} | {j['step_time_median']:.3f} |")
    if rows:
        lines += ["", "| model | precision | B x S | tokens/s | TFLOP/s | MFU (declared peak) | peak GiB | "
                  "median step s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"] + rows
    text = "\n".join(lines) + "\n"
    with open(o.out, "w") as f:
        f.write(text)
    print(text, end="")
    return 0


STAGES = {"curves": stage_curves, "ac_doc": stage_ac_doc, "generate": stage_generate, "snapshot": stage_snapshot}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=list(STAGES) + ["summary"])
    p.add_argument("--build", help="the CUDA build folder (its bin/ and tests/assets/tokenizer)")
    p.add_argument("--results", required=True, help="where the runs and logs go")
    p.add_argument("--out", help="summary: the Markdown file to write")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    o = p.parse_args()
    if o.stage == "summary":
        if not o.out:
            p.error("summary needs --out")
        return summary(o)
    if not o.build:
        p.error(f"{o.stage} needs --build")
    r = Runner(o)
    if not o.dry_run:
        os.makedirs(os.path.join(r.results, o.stage), exist_ok=True)
    try:
        print(f"PASS: {STAGES[o.stage](r)}", flush=True)
        return 0
    except Failure as e:
        print(f"FAIL: {e}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
