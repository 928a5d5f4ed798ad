#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The stages of benchmarks/gpu/device_check.sh that train, generate, measure and compare, and its summary.

    device_check.py STAGE --build B --results R [--judge-only] [--dry-run]
    device_check.py summary --results R --out FOLDER

B holds bin/ (the programs) and tests/assets/tokenizer (the tests' BPE tokenizer); each stage writes its runs
under R/STAGE/, its output to R/STAGE.json (every check with its value, bound and verdict, and the stage's
figures) and prints one line per check, then its verdict ("PASS: ..." or "FAIL: ...") as its last line; it
exits 1 when a check failed. Every check of a stage runs and is reported, also after one failed. --judge-only
runs nothing and judges what R already holds (how the rules are tested on synthetic folders); --dry-run prints
the commands a stage would run ("+ cmd") and runs nothing.

The training runs are scripts/precision_curves.py's job (the debug model on tinyshakespeare, B 4 x S 64, seed
42, deterministic, no activation checkpointing) with the compute dtype named, since its default differs
between CPU (fp32) and GPU (bf16); a run with CUDA_VISIBLE_DEVICES="" trains on the CPU of the same machine.

Why each bound holds on CUDA (the CPU's figures are the committed files: tests/assets/losses and
docs/assets/precision_curves.csv). A mode's effect is its 200-step curve's largest distance from fp32's.
  fp32 against the CPU: titan's CUDA fp32 path is IEEE fp32 throughout (TF32 is off, LibTorch's default, which
    titan never changes; attention runs the memory-efficient kernel in fp32), so the GPU differs from the CPU
    only in the order of its sums: ~sqrt(K) x 2^-24 ~ 1.7e-6 relative on a GEMM of K <= 768, some 1000 times
    less than bf16's rounding of each GEMM input (2^-9). A loss effect scales with the rounding that causes
    it: bf16's is 1.0e-4 relative over the first 20 steps and 1.2e-3 over 200, so fp32's reordering should
    stay near 1e-7 and 1e-6. The bounds, 1e-4 relative (20 steps, against the golden curve) and 1e-4
    absolute (200 steps, against the committed curve), leave a factor 100 and stay below bf16's effect; TF32
    GEMMs (2^-11, a quarter of bf16's unit) would move the 200-step curve by ~3e-4 and fail.
  bf16's effect on the GPU within 1/3 and 3 times the CPU's: both autocasts round the inputs of every GEMM
    and of attention to bf16 (linear, matmul and scaled_dot_product_attention are on both lower-precision
    lists), which is what makes the effect. Where the lists differ the extra sites are elementwise ops and
    reductions with the same unit: at most twice the rounding sites, sqrt(2) to 2 times the effect, and a
    maximum over 200 steps of another draw of that noise spreads by about 1.5 either way. Above 5e-5 as well:
    a run that silently computed in fp32 lands at fp32's reordering distance and fails.
  float8 tensorwise's effect on the GPU within 1/2 and 2 times the CPU's: the effect is e4m3/e5m2 rounding
    (2^-4 and 2^-3 relative), the format's, on either device; Hopper's float8 GEMMs keep about 14 bits of
    their sums (~2^-14), three orders below it, so only the draw of the noise differs (1.5 either way).
  bitwise (0): per-op activation checkpointing recomputes the same kernels on the same inputs, and titan-run
    at world size 1 changes only the environment (a one-rank group has no backend: every collective is the
    identity), so with debug.deterministic both give curve20's losses bit for bit.
  document masks, GPU against this machine's CPU: the fp32 argument above, 1e-4 relative over 20 steps.
  greedy generation: the same token ids on GPU and CPU; fp32 logits differ by ~1e-6 relative, which can
    change an argmax only where the two best logits are that close.
  memory: parameters, gradients and optimizer state are tensor bytes, the same on every device, so the plan
    must match them exactly; the allocator's reserved peak and the activations within 10%, the accuracy
    docs/memory_planner.md states for the planner (CPU layouts, and torchtitan's published H100 runs).
  the eager peer: the same tokens (data checksum) and a step-1 loss within 6 / sqrt(tokens) of titan's
    (benchmarks/peers/compare.py's rule: different draws at the same init scale differ only by sampling).
"""
import argparse
import concurrent.futures
import glob
import json
import math
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
FP32_RELATIVE = 1e-4  # 20 steps, relative; see the module's docstring for every bound
FP32_ABSOLUTE = 1e-4  # 200 steps, absolute
EFFECT_FACTOR = {"bf16": 3.0, "float8_tensorwise": 2.0}
EFFECT_FLOOR = 5e-5
PLAN_TOLERANCE = 0.10
PROMPTS = ["ROMEO:", "To be, or not to be"]
# The throughput shapes (benchmarks/gpu/run.sh's, untied): flavor -> (blocks, 0 for all, batch).
SHAPES = {"1B": (0, 4), "8B": (8, 2)}
BENCH = ["--seq-len", "2048", "--steps", "10", "--warmup", "3"]
# The memory stage's job: the Llama 3.2 1B shape, the trainer's own defaults otherwise; the plan gets these flags,
# the trainer these and its data.
MEMORY_JOB = ["--model.flavor", "1B", "--training.seq_len", "2048", "--training.local_batch_size", "2",
              "--training.steps", "3", "--activation_checkpoint.mode", "none"]


class Failure(Exception):
    pass


class Verdict:
    """A stage's checks (each printed as it is made) and figures, written to R/<stage>.json."""

    def __init__(self, stage):
        self.stage, self.checks, self.figures, self.error = stage, [], {}, None

    def check(self, what, value, bound, ok, why):
        self.checks.append(dict(what=what, value=value, bound=bound, ok=bool(ok), why=why))
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {value} (bound: {bound})", flush=True)

    def near(self, what, got, ref, bound, why, relative=False):
        """Largest |got - ref| (relative to ref) over the steps both have, at most `bound`."""
        if not got or not ref:
            return self.check(what, "no losses", f"<= {bound:g}", False, why)
        d = [abs(x - y) / (abs(y) if relative else 1.0) for x, y in zip(got, ref)]
        at = max(range(len(d)), key=d.__getitem__)
        self.check(what, f"{d[at]:.3g} at step {at + 1}", f"<= {bound:g}", d[at] <= bound, why)
        return d[at]

    def line(self):
        failed = [c["what"] for c in self.checks if not c["ok"]]
        if self.error:
            return f"FAIL: {self.error}" + (f"; failed: {', '.join(failed)}" if failed else "")
        if failed:
            return f"FAIL: {len(failed)} of {len(self.checks)} checks: {', '.join(failed)}"
        return f"PASS: {len(self.checks)} checks"

    def save(self, results):
        os.makedirs(results, exist_ok=True)
        path = os.path.join(results, f"{self.stage}.json")
        write_atomic(path, json.dumps(dict(stage=self.stage, checks=self.checks, figures=self.figures,
                                           error=self.error), indent=2) + "\n")


class Runner:
    def __init__(self, o):
        self.o = o
        self.build = os.path.abspath(o.build)
        self.results = os.path.abspath(o.results)
        self.idle = o.dry_run or o.judge_only

    def program(self, name):
        return os.path.join(self.build, "bin", name)

    def run(self, cmd, log, cpu=False):
        """Runs cmd (on the CPU when cpu: no GPU visible) with its output in log; returns the output (what log
        holds, when judging only)."""
        env_text = 'CUDA_VISIBLE_DEVICES="" ' if cpu else ""
        print(f"+ {env_text}{shlex.join(cmd)} > {log} 2>&1", flush=True)
        if self.o.judge_only:
            return open(log, errors="replace").read() if os.path.isfile(log) else ""
        if self.o.dry_run:
            return ""
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        with open(log, "w") as f:
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            f.write(p.stdout)
        if p.returncode != 0:
            raise Failure(f"{os.path.basename(cmd[0])} exited {p.returncode}; the end of {log}:\n{p.stdout[-1500:]}")
        return p.stdout

    def train(self, name, flags, steps=STEPS, cpu=False, launcher=()):
        """Trains the precision curves' job plus flags into results/<name>; returns its losses by step."""
        dump = os.path.join(self.results, name)
        cmd = list(launcher) + [self.program("train_llama3")] + precision_curves.job(self.build, steps, dump) + flags
        if not self.idle and os.path.isdir(dump):
            shutil.rmtree(dump)  # a rerun starts fresh (the checkpointer would resume)
        self.run(cmd, dump + ".txt", cpu)
        return [] if self.o.dry_run else losses_of(dump, steps)

    def together(self, jobs):
        """Runs the (name, thunk) jobs at once (the GPU has room for several small runs); returns name ->
        result, raising the first failure after all have ended."""
        if self.idle:
            return {name: job() for name, job in jobs}
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            futures = {name: pool.submit(job) for name, job in jobs}
            return {name: f.result() for name, f in futures.items()}


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def losses_of(dump, steps):
    try:
        return precision_curves.read_losses(dump, steps)
    except (OSError, ValueError) as e:
        raise Failure(str(e))


def golden_curve():
    with open(GOLDEN) as f:
        return [float(line.split()[1]) for line in f if line.strip() and not line.startswith("#")]


def committed_curves():
    with open(CURVES_CSV) as f:
        header = f.readline().strip().split(",")
        rows = [line.strip().split(",") for line in f if line.strip()]
    return {name: [float(r[i]) for r in rows] for i, name in enumerate(header) if name != "step"}


def distance(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def learned(v, what, losses, drop):
    v.check(f"{what} learns", f"{losses[0]:.3f} -> {losses[-1]:.3f}", f"falls by > {drop}",
            losses[-1] < losses[0] - drop, "from ~ln(2048) = 7.6, as the CPU's curves do")


def stage_curve20(r, v):
    # Saved at its last step for the generate stage.
    losses = r.train("curve20/fp32", MODES["fp32"] + ["--checkpoint.enable", "true"])
    if r.o.dry_run:
        return
    v.figures["losses"] = losses
    v.near("fp32, 20 steps, vs the golden CPU curve", losses, golden_curve(), FP32_RELATIVE,
           "IEEE fp32 on both devices, sums in another order (module docstring)", relative=True)
    learned(v, "fp32, 20 steps", losses, 1.0)


def stage_curves200(r, v):
    losses = r.together([(mode, lambda m=mode, f=flags: r.train(f"curves200/{m}", f, steps=CURVE_STEPS))
                         for mode, flags in MODES.items()])
    if r.o.dry_run:
        return
    write_atomic(os.path.join(r.results, "curves.csv"),  # this device's curves, as the committed CSV
                 "step," + ",".join(losses) + "\n" + "".join(
                     f"{s + 1}," + ",".join(f"{losses[m][s]:.6f}" for m in losses) + "\n" for s in range(CURVE_STEPS)))
    cpu = committed_curves()
    v.figures["max_distance"] = {}
    v.near("fp32, 200 steps, vs the committed CPU curve", losses["fp32"], cpu["fp32"], FP32_ABSOLUTE,
           "IEEE fp32 on both devices; TF32 GEMMs would fail it (module docstring)")
    for mode, factor in EFFECT_FACTOR.items():
        claimed, here = distance(cpu[mode], cpu["fp32"]), distance(losses[mode], losses["fp32"])
        low, high = max(claimed / factor, EFFECT_FLOOR), claimed * factor
        v.check(f"{mode}'s effect (distance from this GPU's fp32)", f"{here:.3g}",
                f"in ({low:.3g}, {high:.3g}]: the CPU's {claimed:.3g} / x {factor:g}", low < here <= high,
                "the format's rounding, on either device (module docstring)")
        v.figures["max_distance"][f"{mode}_vs_cpu_{mode}"] = distance(losses[mode], cpu[mode])
        v.figures["max_distance"][f"{mode}_effect"] = here
    for mode in MODES:
        learned(v, f"{mode}, 200 steps", losses[mode], 2.0)


def curve20_losses(r):
    dump = os.path.join(r.results, "curve20/fp32")
    if r.o.dry_run:
        return []
    if not os.path.isfile(os.path.join(dump, "metrics.jsonl")):
        raise Failure(f"expected curve20's run in {dump}, got none: run STAGES=curve20 first")
    return losses_of(dump, STEPS)


def stage_trainer_nccl(r, v):
    reference = curve20_losses(r)
    losses = r.train("trainer_nccl/fp32", MODES["fp32"], launcher=[r.program("titan-run"), "--nproc-per-node", "1"])
    if r.o.dry_run:
        return
    v.near("titan-run, world size 1, vs curve20", losses, reference, 0.0,
           "the launcher changes only the environment: the same kernels, bit for bit")


def stage_ac_doc(r, v):
    reference = curve20_losses(r)
    per_op = ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"]
    document = MODES["fp32"] + ["--training.packing", "document"]
    runs = r.together([("ac", lambda: r.train("ac_doc/per_op_ac", MODES["fp32"] + per_op)),
                       ("device", lambda: r.train("ac_doc/document", document)),
                       ("cpu", lambda: r.train("ac_doc/document_cpu", document, cpu=True))])
    if r.o.dry_run:
        return
    v.near("per-op AC vs no AC (curve20)", runs["ac"], reference, 0.0,
           "recomputation reruns the same kernels on the same inputs, bit for bit")
    v.near("document masks, GPU vs this machine's CPU", runs["device"], runs["cpu"], FP32_RELATIVE,
           "IEEE fp32 on both devices, sums in another order", relative=True)


def stage_generate(r, v):
    checkpoint = os.path.join(r.results, "curve20/fp32/checkpoint")
    if not r.idle and not os.path.isdir(checkpoint):
        raise Failure(f"expected curve20's checkpoint in {checkpoint}, got none: run STAGES=curve20 first")
    cmd = [r.program("titan-generate"), "--checkpoint", checkpoint, "--model.flavor", "debugmodel",
           "--model.hf_assets_path", os.path.join(r.build, "tests/assets/tokenizer"), "--greedy",
           "--max-new-tokens", "48", "--output", "jsonl"]
    for p in PROMPTS:
        cmd += ["--prompt", p]
    outputs = r.together([(where, lambda w=where: r.run(cmd, os.path.join(r.results, f"generate/{w}.txt"),
                                                        cpu=w == "cpu")) for where in ("device", "cpu")])
    if r.o.dry_run:
        return
    ids = {w: [json.loads(line)["ids"] for line in out.splitlines() if line.startswith("{")]
           for w, out in outputs.items()}
    v.figures["ids"] = ids
    same = len(ids["device"]) == len(PROMPTS) and ids["device"] == ids["cpu"]
    first = next((f"prompt {p + 1}, token {t + 1}" for p, (a, b) in enumerate(zip(ids["device"], ids["cpu"]))
                  for t, (x, y) in enumerate(zip(a, b)) if x != y), "none")
    v.check("greedy token ids, GPU vs CPU", f"{sum(map(len, ids['device']))} tokens, first difference: {first}",
            f"the CPU's {sum(map(len, ids['cpu']))} ids", same, "fp32 logits a few ulps apart keep every argmax")


def stage_snapshot(r, v):
    dump = os.path.join(r.results, "snapshot/run")
    r.train("snapshot/run", MODES["bf16"] + ["--profiling.enable_memory_snapshot", "true",
                                             "--profiling.profile_freq", "2"], steps=4)
    if r.o.dry_run:
        return
    found = sorted(glob.glob(os.path.join(dump, "memory_snapshot", "iteration_*", "rank0_memory_snapshot.pickle")))
    v.check("the allocator's snapshot written", found[-1] if found else "none", "a rank0_memory_snapshot.pickle",
            bool(found), "profiling.enable_memory_snapshot on CUDA writes PyTorch's pickle")
    if not found:
        return
    with open(found[-1], "rb") as f:
        snapshot = pickle.load(f)
    segments = snapshot.get("segments", [])
    events = sum(len(t) for t in snapshot.get("device_traces", []))
    v.check("the snapshot's segments and trace", f"{len(segments)} segments, {events} events", "both > 0",
            segments and events > 0, "pytorch.org/memory_viz needs both")
    shutil.copy(found[-1], os.path.join(r.results, "memory_snapshot.pickle"))
    v.figures["reserved_gib"] = sum(s.get("total_size", 0) for s in segments) / 2**30


def last_record_with(path, key):
    record = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if key in row:
                record = row
    return record


def stage_memory_plan(r, v):
    dump = os.path.join(r.results, "memory_plan/run")
    gpu = "H200" if "H200" in r.o.gpu else "H100"
    planned = r.run([r.program("titan-plan")] + MEMORY_JOB + ["--gpus", "1", "--gpu", gpu, "--json"],
                    os.path.join(r.results, "memory_plan/plan.json"))
    data = ["--model.hf_assets_path", os.path.join(r.build, "tests/assets/tokenizer"),
            "--training.dataset", "tinyshakespeare",
            "--training.dataset_path", os.path.join(ROOT, "tests/assets/tinyshakespeare/input.txt"),
            "--metrics.log_freq", "1", "--checkpoint.enable", "false"]
    if not r.idle and os.path.isdir(dump):
        shutil.rmtree(dump)
    r.run([r.program("train_llama3")] + MEMORY_JOB + data + ["--job.dump_folder", dump], dump + ".txt")
    if r.o.dry_run:
        return
    plan, _ = json.JSONDecoder().raw_decode(planned[planned.index("{"):])  # whatever it logged around it aside
    measured = last_record_with(os.path.join(dump, "metrics.jsonl"), "memory/max_reserved(GiB)")
    gib = 2**30
    pairs = {part: (plan["bytes"][part], measured.get(f"memory/{part}(GiB)", math.nan) * gib)
             for part in ("parameters", "gradients", "optimizer", "activations")}
    pairs["reserved"] = (plan["bytes"]["reserved"], measured.get("memory/max_reserved(GiB)", math.nan) * gib)
    v.figures["planned_vs_measured_bytes"] = pairs
    for part, (want, got) in pairs.items():
        exact = part in ("parameters", "gradients", "optimizer")
        # The trainer logs GiB with a double's precision: exact to well under a byte at these sizes.
        bound = 1.0 if exact else PLAN_TOLERANCE * want
        v.check(f"{part}: measured vs planned", f"{got / gib:.3f} vs {want / gib:.3f} GiB",
                "to the byte" if exact else f"within {PLAN_TOLERANCE:.0%}", abs(got - want) <= bound,
                "tensor bytes, the same on every device" if exact else "the planner's stated accuracy")


def stage_throughput(r, v, flavor, precision):
    layers, batch = SHAPES[flavor]
    name = f"throughput_{flavor}_{precision}"
    out = os.path.join(r.results, name, "run.json")
    float8 = ["--float8", "tensorwise"] if precision == "float8" else []
    r.run([r.program("bench_step_throughput"), "--device", "cuda", "--flavor", flavor, "--n-layers", str(layers),
           "--tie-embeddings", "0", "--batch", str(batch)] + BENCH + ["--mixed-precision", "bf16"] + float8 +
          ["--json", out], os.path.join(r.results, name, "bench.txt"))
    if r.o.dry_run:
        return
    with open(out) as f:
        j = json.load(f)
    v.figures.update({k: j[k] for k in ("tps", "tflops", "mfu_declared", "peak_memory_bytes", "step_time_median")})
    v.check("titan's losses finite", f"{j['losses'][0]:.4f} -> {j['losses'][-1]:.4f}", "finite",
            all(math.isfinite(x) for x in j["losses"]), "a NaN or inf is a broken step")


def stage_peer(r, v, flavor="1B"):
    layers, batch = SHAPES[flavor]
    out = os.path.join(r.results, f"peer_eager_{flavor}_bf16", "run.json")
    r.run([sys.executable, os.path.join(ROOT, "benchmarks/peers/peer_step.py"), "--model", "eager", "--device", "cuda",
           "--flavor", flavor, "--n-layers", str(layers), "--batch", str(batch)] + BENCH +
          ["--mixed-precision", "bf16", "--json", out], os.path.join(r.results, f"peer_eager_{flavor}_bf16", "peer.txt"))
    if r.o.dry_run:
        return
    with open(out) as f:
        peer = json.load(f)
    v.figures.update({k: peer[k] for k in ("tps", "tflops", "peak_memory_bytes", "step_time_median")})
    titan_json = os.path.join(r.results, f"throughput_{flavor}_bf16", "run.json")
    if not os.path.isfile(titan_json):
        return v.check("the peer against titan", "no titan run", "titan's throughput_1B_bf16 JSON", False,
                       "the same shape's titan run comes first")
    with open(titan_json) as f:
        titan = json.load(f)
    v.figures["tps_titan_over_eager"] = titan["tps"] / peer["tps"]
    v.check("the peer's tokens", peer["data_checksum"], f"titan's {titan['data_checksum']}",
            peer["data_checksum"] == titan["data_checksum"], "both draw the batch on the CPU from seed 0")
    tokens = batch * 2048
    v.check("the peer's step-1 loss vs titan's", f"{abs(peer['losses'][0] - titan['losses'][0]):.4f}",
            f"<= 6 / sqrt({tokens}) = {6 / tokens ** 0.5:.4f}",
            abs(peer["losses"][0] - titan["losses"][0]) <= 6 / tokens ** 0.5,
            "benchmarks/peers/compare.py's rule: draws at the same init scale differ by sampling only")


STAGES = {
    "curve20": stage_curve20, "curves200": stage_curves200, "trainer_nccl": stage_trainer_nccl,
    "ac_doc": stage_ac_doc, "generate": stage_generate, "snapshot": stage_snapshot, "memory_plan": stage_memory_plan,
    "throughput_1B_bf16": lambda r, v: stage_throughput(r, v, "1B", "bf16"),
    "throughput_1B_float8": lambda r, v: stage_throughput(r, v, "1B", "float8"),
    "throughput_8B_bf16": lambda r, v: stage_throughput(r, v, "8B", "bf16"),
    "throughput_8B_float8": lambda r, v: stage_throughput(r, v, "8B", "float8"),
    "peer_eager_1B_bf16": stage_peer,
}


def run_stage(o):
    r = Runner(o)
    v = Verdict(o.stage)
    if not r.idle:
        os.makedirs(os.path.join(r.results, o.stage), exist_ok=True)
    try:
        STAGES[o.stage](r, v)
    except Failure as e:
        v.error = str(e)
    if o.dry_run:
        return 0
    v.save(r.results)
    print(v.line(), flush=True)
    return 0 if v.line().startswith("PASS") else 1


# ---- the summary --------------------------------------------------------------------------------------------

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def stage_rows(results):
    """stages.tsv's rows, the last of each stage (a warm second call appends to the first's)."""
    rows = {}
    path = os.path.join(results, "stages.tsv")
    if os.path.isfile(path):
        for line in open(path):
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 4:
                name, status, seconds, limit = parts[:4]
                rows[name] = dict(stage=name, status=status, seconds=seconds, limit=limit,
                                  note=parts[4] if len(parts) > 4 else "")
    return list(rows.values())


def last_line(path):
    if not os.path.isfile(path):
        return ""
    tail = [line.strip() for line in open(path, errors="replace") if line.strip()]
    return tail[-1][:240] if tail else ""


def summary(o):
    """summary.md and figures.json in o.out: the machine, every stage, every check, every figure."""
    results = os.path.abspath(o.results)
    machine = open(os.path.join(results, "machine.txt")).read().rstrip() if os.path.isfile(
        os.path.join(results, "machine.txt")) else "(not recorded)"
    stages = stage_rows(results)
    figures = dict(machine=machine.splitlines(), stages=stages, checks={}, figures={})
    lines = ["# titan device check", "", *[f"    {line}" for line in machine.splitlines()], "",
             "| stage | result | seconds | limit | detail |", "| --- | --- | --- | --- | --- |"]
    for s in stages:
        detail = s["note"] or last_line(os.path.join(results, f"{s['stage']}.log"))
        lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']} | {s['limit']} | {detail.replace('|', '/')} |")
    if not stages:
        lines.append("| (no stage has run yet) | | | | |")
    checks = []
    for s in stages:
        j = read_json(os.path.join(results, f"{s['stage']}.json"))
        if j:
            figures["checks"][s["stage"]] = j["checks"]
            figures["figures"][s["stage"]] = j["figures"]
            checks += [(s["stage"], c) for c in j["checks"]]
    if checks:
        lines += ["", "| stage | check | value | bound | verdict |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {st} | {c['what']} | {c['value']} | {c['bound']} | {'ok' if c['ok'] else 'FAIL'} |"
                  for st, c in checks]
    runs = [j for j in (read_json(os.path.join(results, s["stage"], "run.json")) for s in stages) if j and "tps" in j]
    if runs:
        lines += ["", "| side | model | precision | B x S | tokens/s | TFLOP/s | MFU (declared peak) | peak GiB | "
                  "median step s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for j in runs:
            precision = j["mixed_precision"] + ("" if j["float8"] == "none" else f" + float8 {j['float8']}")
            mfu = f"{j['mfu_declared']:.1f}%" if j.get("mfu_declared") else "-"
            lines.append(f"| {j['side']} | {j['flavor']} ({j['n_layers']} layers, {j['params'] / 1e9:.2f}B) | "
                         f"{precision} | {j['batch']} x {j['seq_len']} | {j['tps']:.0f} | {j['tflops']:.1f} | {mfu} | "
                         f"{j['peak_memory_bytes'] / 2**30:.1f} | {j['step_time_median']:.3f} |")
        figures["throughput"] = [{k: v for k, v in j.items() if k not in ("step_times", "warmup_times")} for j in runs]
    text = "\n".join(lines) + "\n"
    os.makedirs(o.out, exist_ok=True)
    write_atomic(os.path.join(o.out, "summary.md"), text)
    write_atomic(os.path.join(o.out, "figures.json"), json.dumps(figures, indent=1) + "\n")
    print(text, end="")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=list(STAGES) + ["summary"])
    p.add_argument("--build", help="the folder with bin/ and tests/assets/tokenizer")
    p.add_argument("--results", required=True, help="where the runs, logs and verdicts go")
    p.add_argument("--out", help="summary: the folder for summary.md and figures.json")
    p.add_argument("--gpu", default="", help="memory_plan: the GPU's name (nvidia-smi's), for the plan")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--judge-only", action="store_true", help="run nothing; judge what --results holds")
    o = p.parse_args()
    if o.stage == "summary":
        if not o.out:
            p.error("summary needs --out")
        return summary(o)
    if not o.build:
        p.error(f"{o.stage} needs --build")
    return run_stage(o)


if __name__ == "__main__":
    sys.exit(main())
