# SPDX-License-Identifier: BSD-3-Clause
"""torchtitan's activation checkpointing on the workload of bench_activation_checkpoint: the blocks of
torchtitan's Llama 3 (pip package) at the same shape, wrapped by torchtitan's own apply_ac (full,
selective N, and op with its llama3 save list), forward + backward of a (B, S, D) fp32 input on CPU.

Per mode: the bytes the forward leaves alive, the peak above the start over forward + backward (from
the profiler's allocation events, a run of its own), and the median forward + backward time (runs
without the profiler). Parameter gradients exist from a warm-up run, as in titan's benchmark.

On CPU torchtitan's op policy recomputes attention: its save list names the CUDA SDPA kernels, and the
CPU kernel (_scaled_dot_product_flash_attention_for_cpu) is not among them.

    python benchmarks/peers/ac_peer.py --dim 512 --seq 2048 --batch 4 --iters 3
"""
import argparse
import statistics
import time

import torch


def build(o):
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer

    args = TransformerModelArgs(dim=o.dim, n_layers=o.layers, n_heads=o.heads, vocab_size=2048, rope_theta=500000,
                                max_seq_len=o.seq)
    torch.manual_seed(1)
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights()
    return model


def apply_mode(model, mode):
    if mode == "none":
        return
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    if mode == "full":
        config = ActivationCheckpoint(mode="full")
    else:
        config = ActivationCheckpoint(mode="selective", selective_ac_option=mode.split(":", 1)[1])
    apply_ac(model, config, op_sac_save_list=_op_sac_save_list)


def forward(model, x):
    h = x
    for layer in model.layers.values():
        h = layer(h, model.freqs_cis, attention_masks=None)
    return h


def memory_run(model, x, grad):
    """(kept after forward, peak over forward + backward), bytes above the start."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        inp = x.clone().requires_grad_(True)
        with record_function("titan_forward_end_marker_start"):
            pass
        y = forward(model, inp)
        with record_function("titan_forward_end_marker"):
            pass
        y.backward(grad)
        del y
    events = list(prof.profiler.kineto_results.events())
    start = min(e.start_ns() for e in events if e.name() == "titan_forward_end_marker_start")
    mark = min(e.start_ns() for e in events if e.name() == "titan_forward_end_marker")
    allocations = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.start_ns() >= start)
    live = peak = kept = 0
    for ts, nbytes in allocations:
        if ts > mark and kept == 0:
            kept = live
        live += nbytes
        peak = max(peak, live)
    return kept, peak


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--modes", default="none,selective:2,selective:op,full")
    o = p.parse_args()
    print(f"torchtitan {o.layers} Llama 3 blocks dim {o.dim} heads {o.heads}, batch {o.batch} x seq {o.seq}, fp32, "
          f"{torch.get_num_threads()} intra-op threads")
    print("| mode | kept after forward MiB | peak fwd+bwd MiB | fwd+bwd s | time vs none |\n|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(o.batch, o.seq, o.dim, generator=gen)
    grad = torch.randn(o.batch, o.seq, o.dim, generator=gen) / 64
    none_seconds = None
    for mode in o.modes.split(","):
        model = build(o)
        apply_mode(model, mode)
        forward(model, x.clone().requires_grad_(True)).backward(grad)  # parameter gradients exist from here
        kept, peak = memory_run(model, x, grad)
        times = []
        for _ in range(o.iters):
            start = time.perf_counter()
            forward(model, x.clone().requires_grad_(True)).backward(grad)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        if mode == "none":
            none_seconds = seconds
        vs = f"{100 * (seconds / none_seconds - 1):+.0f}%" if none_seconds else "-"
        print(f"| {mode} | {kept / 2**20:.1f} | {peak / 2**20:.1f} | {seconds:.2f} | {vs} |", flush=True)
        del model


if __name__ == "__main__":
    main()
