# SPDX-License-Identifier: BSD-3-Clause
"""torchtitan's side of the MoE step benchmark (bench_moe, benchmarks/moe_step.cpp, is titan's side).

One process, one rank, fp32 on CPU: torchtitan's own DeepSeek-V3 (`DeepSeekV3Model` and the `deepseekv3_args`
flavor table from the pip `torchtitan` package, pinned in scripts/requirements.txt) or Qwen3
(`Qwen3Model`, `qwen3_args`), trained step by step the way torchtitan's `train_step` does it: token-sum
cross-entropy divided by the batch's token count, `clip_grad_norm_` at 1.0 (foreach), then the optimizer
that torchtitan's MoE train specs build, `build_optimizers_with_moe_load_balancing` (AdamW lr 1e-4, betas
0.9/0.95, eps 1e-8, weight decay 0.1, fused; its step pre-hook moves each layer's expert bias from the
tokens_per_expert counts, the auxiliary-loss-free balancing titan's ExpertParallel::update_expert_bias does).

Configured as torchtitan's trainer configures it: the flavor's args go through `update_from_config` with a
default `JobConfig` whose `training.seq_len` is the benchmark's. On a machine without an SM90 GPU that turns
`moe_args.use_grouped_mm` off ("Failed to use grouped mm, which is only supported on SM90 or later"): the
routed experts run torchtitan's per-expert for-loop. That is also the only fp32 path: its grouped-mm path
casts x and the expert weights to bf16 around `torch._grouped_mm`. titan's side defaults to at::_grouped_mm
in fp32 (bitwise equal to its loop on CPU); `bench_moe --grouped-mm 0` runs titan's loop instead.

One shim: torchtitan's router counts the slots per expert with `torch.histc` on the int64 expert indices,
which this torch implements on CUDA only (CPU: 'NotImplementedError: "histogram_cpu" not implemented for
'Long''). `cpu_int_histc` below answers those calls with `torch.bincount(x, minlength=bins)`, the same counts
(the indices are integers in [0, bins) and each bin is one expert wide), int64 as CUDA's histc returns;
every other call goes to torch.histc.

Same sizes as titan's side; the batch is drawn the same way (torch.manual_seed(0), two randint of (B, S):
the data_checksum agrees); the initial weights are torchtitan's own init under torch.manual_seed(0), not
titan's, so the step-1 losses agree in range (about ln(vocab)), not bit for bit.

    benchmarks/peers/moe_peer.py --model deepseek_v3 --flavor debugmodel --seq-len 256 --batch 8 --threads 1
"""
import argparse
import copy
import json
import time

import torch
import torch.nn.functional as F


def cpu_int_histc():
    original = torch.histc

    def histc(x, bins=100, min=0, max=0, **kwargs):  # noqa: A002 (torch.histc's names)
        if x.device.type == "cpu" and not x.is_floating_point() and min == 0 and max == bins and not kwargs:
            return torch.bincount(x, minlength=bins)
        return original(x, bins=bins, min=min, max=max, **kwargs)

    torch.histc = histc


def build(o):
    from torchtitan.config.job_config import JobConfig

    job = JobConfig()
    job.training.seq_len = o.seq_len
    if o.model == "deepseek_v3":
        from torchtitan.models.deepseek_v3 import DeepSeekV3Model as Model
        from torchtitan.models.deepseek_v3 import deepseekv3_args as table
    else:
        from torchtitan.models.qwen3 import Qwen3Model as Model
        from torchtitan.models.qwen3 import qwen3_args as table
    args = copy.deepcopy(table[o.flavor])
    args.update_from_config(job)  # max_seq_len = seq_len; use_grouped_mm off without SM90; moe_impl "standard"
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Model(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    return model, args


def update_expert_bias(model):
    """torchtitan's _update_expert_bias (components/optimizer.py) on one rank: per MoE layer,
    bias += d - mean(d), d = coeff * sign(mean(load) - load), then the counts zeroed."""
    with torch.no_grad():
        for block in model.layers.values():
            moe = getattr(block, "moe", None) if getattr(block, "moe_enabled", False) else None
            if moe is None or moe.load_balance_coeff is None:
                continue
            load = moe.tokens_per_expert.float()
            delta = moe.load_balance_coeff * torch.sign(load.mean() - load)
            moe.expert_bias.add_(delta - delta.mean())
            moe.tokens_per_expert.zero_()


def data_checksum(x, y):
    """The batch in one number (bench_moe computes the same): the sides' batches agree."""
    w = torch.arange(1, x.numel() + 1, dtype=torch.long)
    return int((x.reshape(-1) * w).sum() + 3 * (y.reshape(-1) * w).sum())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="deepseek_v3", choices=["deepseek_v3", "qwen3"])
    p.add_argument("--flavor", default="", help="default: debugmodel (deepseek_v3), debugmodel_moe (qwen3)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--json", default="")
    o = p.parse_args()
    o.flavor = o.flavor or ("debugmodel" if o.model == "deepseek_v3" else "debugmodel_moe")
    torch.set_num_threads(o.threads)
    cpu_int_histc()

    from torchtitan.components.optimizer import build_optimizers_with_moe_load_balancing
    from torchtitan.config.job_config import Optimizer as OptimizerConfig
    from torchtitan.distributed.parallel_dims import ParallelDims

    model, args = build(o)
    # torchtitan's optimizer (build_optimizers' AdamW: lr 1e-4 here, betas 0.9/0.95, eps 1e-8, weight decay
    # 0.1, fused) and its balancing pre-hook, written out: build_optimizers_with_moe_load_balancing's hook asks
    # ParallelDims for the "loss" mesh, which it builds on device "cuda" even on a CPU-only machine
    # ("RuntimeError: Found no NVIDIA driver on your system").
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    opt.register_step_pre_hook(lambda *_: update_expert_bias(model))
    vocab = model.tok_embeddings.weight.shape[0]
    torch.manual_seed(0)
    x = torch.randint(0, vocab, (o.batch, o.seq_len))
    y = torch.randint(0, vocab, (o.batch, o.seq_len))
    tokens = o.batch * o.seq_len

    def step():
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(0, 1), reduction="sum") / tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()  # the pre-hook updates the expert biases first
        return loss.item()

    times, losses = [], []
    for s in range(o.warmup + o.steps):
        t0 = time.perf_counter()
        losses.append(step())
        if s >= o.warmup:
            times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    params = sum(p.numel() for p in model.parameters())
    moe = args.moe_args
    result = dict(side="torchtitan", model=o.model, flavor=o.flavor, params=params, batch=o.batch,
                  seq_len=o.seq_len, threads=torch.get_num_threads(), use_grouped_mm=moe.use_grouped_mm,
                  experts=moe.num_experts, top_k=moe.top_k, step_times=times, step_time_median=med,
                  tps=tokens / med, losses=losses, data_checksum=data_checksum(x, y))
    print(f"torchtitan MoE: {o.model} {o.flavor} ({params / 1e6:.2f}M params, E={moe.num_experts} K={moe.top_k}, "
          f"use_grouped_mm={moe.use_grouped_mm}) B={o.batch} S={o.seq_len} threads={torch.get_num_threads()}")
    print(f"torchtitan MoE: step median {med:.3f} s  tokens/s {tokens / med:.0f}  "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if o.json:
        with open(o.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
