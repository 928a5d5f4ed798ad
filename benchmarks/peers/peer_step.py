# SPDX-License-Identifier: BSD-3-Clause
"""The Python side of the side-by-side step benchmark (bench_step_throughput is the C++ side).

One process is one rank. `--model torchtitan` builds torchtitan's own Llama 3 (`Transformer` from the pip
`torchtitan` package, pinned in scripts/requirements.txt); `--model eager` the plain-PyTorch model of
llama3_eager.py. Under torchrun with WORLD_SIZE > 1 the model is sharded with FSDP2 (`fully_shard`) over a
one-axis mesh of all ranks (Gloo on CPU, NCCL on GPU): for torchtitan by its own `apply_fsdp` (embeddings,
each block, norm + output, root; fp32 all-gather and reduce on CPU), for the eager model by the same units.

Why not torchtitan's trainer (`torchrun -m torchtitan.train`)? On a machine without an accelerator it
picks device "cuda" anyway (tools/utils.py `get_device_info` falls back to "cuda") and stops at
`torch.cuda.set_device` with "RuntimeError: Found no NVIDIA driver on your system". So this script
drives the step itself, the way torchtitan's `train_step` does: token-sum cross-entropy divided by the
global token count, `clip_grad_norm_` (torchtitan's, DTensor-aware) at 1.0, AdamW (betas 0.9/0.95,
eps 1e-8, weight decay 0.1, fused) at lr 1e-4, `zero_grad(set_to_none=True)`.

Precision: `--mixed-precision bf16` is torchtitan's: `torch.autocast(device, torch.bfloat16)` around
the forward on one rank (its maybe_enable_amp), FSDP2's MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32) over 2 ranks (apply_fsdp's param_dtype). `--float8 <recipe>` converts every Linear but
the output head with torchao's `convert_to_float8_training` before sharding (torchtitan's converter does
the same with filter_fqns=["output"]).

`--compile` is torchtitan's `--compile.enable` with its default components ("model", "loss"): each
TransformerBlock is wrapped by `torch.compile(block, fullgraph=True)` (inductor) and put back in its place in
`model.layers`, after the float8 conversion and before FSDP2's `fully_shard`, the order of torchtitan 0.2.2's
`parallelize_llama` (`apply_compile`); the cross-entropy (token sum) is `torch.compile`d too, as its
`build_cross_entropy_loss` does. Embeddings, final norm and output head stay eager. Inductor on CPU writes
and builds C++ at run time: it needs a C++ compiler (g++) on the PATH. Compilation happens in the first
warm-up step, so `--compile` needs `--warmup` >= 1 and the timed steps exclude it; the JSON and the printed
lines state `first_step_s` (the first step's wall time) and `compile_s` (its excess over the median timed
step), and `graphs_timed` (Dynamo graphs compiled during the timed steps: 0 unless something recompiled).
Inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR; by default under the temp folder) makes a repeated compile
cheaper, so compile_s depends on whether the cache was warm; compare.py gives every compiled run a fresh one.
With `--model eager` it compiles the eager model's blocks the same way.

Memory, next to the process's peak RSS (which counts the Python runtime and its libraries): after the
timed steps, the bytes of this rank's training state (parameters' local shards, gradients, optimizer
state) and one more step under `torch.profiler(profile_memory=True)`, whose allocation events give the
most bytes live at once in that step on top of that state: the same two figures titan's allocator
tracker gives (bench_step_throughput's `state_bytes`, `step_peak_bytes`).

    torchrun --nproc-per-node 2 benchmarks/peers/peer_step.py --model torchtitan --flavor debugmodel
    python benchmarks/peers/peer_step.py --model torchtitan --compile --seq-len 128 --batch 2 --threads 2
"""
import argparse
import copy
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama3_eager  # noqa: E402


def torchtitan_args(flavor, n_layers, seq_len):
    """torchtitan's TransformerModelArgs for a titan flavor; titan's "100M" and "1B" are mirrored here
    because torchtitan 0.2.2's table has neither (1B is untied: its Transformer has no weight tying)."""
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.args import TransformerModelArgs

    if flavor in llama3_args:
        args = copy.deepcopy(llama3_args[flavor])
    else:
        a = llama3_eager.FLAVORS[flavor]
        args = TransformerModelArgs(dim=a["dim"], n_layers=a["n_layers"], n_heads=a["n_heads"],
                                    n_kv_heads=a["n_kv_heads"], vocab_size=a["vocab"], multiple_of=a["multiple_of"],
                                    ffn_dim_multiplier=a["mult"], rope_theta=500000)
    if n_layers > 0:
        args.n_layers = n_layers
    args.max_seq_len = seq_len  # torchtitan's trainer does the same (update_from_config)
    return args


def flops_per_token(params, embedding_params, n_layers, n_heads, head_dim, seq_len):
    """torchtitan's formula (models/utils.py): 6 * (N - N_embedding) + 6 * L * H * (2 * HD) * S."""
    return 6 * (params - embedding_params) + 6 * n_layers * n_heads * 2 * head_dim * seq_len


def convert_float8(model, recipe):
    """torchao's float8 training for every Linear but the output head (torchtitan's filter_fqns=["output"])."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda m, fqn: fqn != "output")
    from torchao.float8.float8_linear import Float8Linear

    return sum(isinstance(m, Float8Linear) for m in model.modules())


def apply_compile(model):
    """torchtitan 0.2.2's apply_compile: every block of `model.layers` replaced by its torch.compile'd
    (inductor, fullgraph) wrapper under the same name, so FSDP2 units, state-dict keys and the block
    loop see the compiled module where the block was. Identical blocks share one compiled graph (Dynamo
    inlines nn.Module parameters as inputs), so this compiles one forward and one backward, not one per block."""
    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, torch.compile(block, fullgraph=True))


def build(o, device, mesh):
    """The model with its FSDP units applied (when `mesh`), initialised on `device`."""
    # FSDP2's MixedPrecisionPolicy param dtype: bf16 when asked (and always on GPU, as before).
    dtype = torch.bfloat16 if device.type == "cuda" or o.mixed_precision == "bf16" else torch.float32
    converted = 0
    if o.model == "torchtitan":
        from torchtitan.models.llama3.model.model import Transformer

        args = torchtitan_args(o.flavor, o.n_layers, o.seq_len)
        with torch.device("meta"):
            model = Transformer(args)
        n_layers, n_heads, dim = args.n_layers, args.n_heads, args.dim
        if o.float8 != "none":
            converted = convert_float8(model, o.float8)
        if o.compile:  # after the float8 swap, before fully_shard: torchtitan's order
            apply_compile(model)
        if mesh is not None:
            from torchtitan.models.llama3.infra.parallelize import apply_fsdp

            # torchtitan 0.2.2's default reshard rule: embeddings and every block resharded after forward,
            # norm + output kept (titan's side runs --reshard-after-forward always, the same rule).
            apply_fsdp(model, mesh, param_dtype=dtype, reduce_dtype=torch.float32, pp_enabled=False)
        model.to_empty(device=device)
        with torch.no_grad():
            model.init_weights(buffer_device=device)
    else:
        a = dict(llama3_eager.FLAVORS[o.flavor])
        if o.n_layers > 0:
            a["n_layers"] = o.n_layers
        with torch.device(device):
            model = llama3_eager.Llama3(a, o.seq_len)
        n_layers, n_heads, dim = a["n_layers"], a["n_heads"], a["dim"]
        if o.float8 != "none":
            converted = convert_float8(model, o.float8)
        if o.compile:
            apply_compile(model)
        if mesh is not None:
            from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            fully_shard(model.tok_embeddings, mesh=mesh, mp_policy=mp)
            for block in model.layers:
                fully_shard(block, mesh=mesh, mp_policy=mp)
            fully_shard([model.norm, model.output], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            for m in model.modules():  # the loss is already divided by the global token count
                if isinstance(m, FSDPModule):
                    m.set_gradient_divide_factor(1.0)
    if mesh is not None and device.type == "cpu":
        # A divide factor becomes NCCL's PREMUL_SUM reduce-scatter, which Gloo rejects ("RuntimeError: Cannot
        # use ReduceOp.PREMUL_SUM with Gloo"); force plain SUM (and a divide by 1) as titan's Gloo path does.
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
    params = sum(p.numel() for p in model.parameters())  # a DTensor's numel() is the global size
    embedding = model.tok_embeddings.weight.numel()
    fpt = flops_per_token(params, embedding, n_layers, n_heads, dim // n_heads, o.seq_len)
    return model, params, fpt, n_layers, converted


def local_bytes(tensors):
    """Bytes of the distinct storages of `tensors` (a DTensor counts its local shard)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def state_bytes(model, opt):
    params = list(model.parameters())
    states = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return local_bytes(params) + local_bytes(p.grad for p in params) + local_bytes(states)


def profiled_peak(step):
    """The most CPU bytes live at once during `step()` beyond those live at its start: the running sum of the
    profiler's allocation (+) and free (-) events of every thread, in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def data_checksum(x, y):
    """Rank 0's tokens in one number (bench_step_throughput computes the same): the sides' batches agree."""
    w = torch.arange(1, x.numel() + 1, dtype=torch.long)
    return int((x.cpu().reshape(-1) * w).sum() + 3 * (y.cpu().reshape(-1) * w).sum())


def peak_memory(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB; titan reports VmHWM alike


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="torchtitan", choices=["torchtitan", "eager"])
    p.add_argument("--flavor", default="debugmodel", choices=sorted(llama3_eager.FLAVORS))
    p.add_argument("--n-layers", type=int, default=0, help="override the flavor's block count (0: keep)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--mixed-precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: autocast on one rank, FSDP2 MixedPrecisionPolicy(bf16, fp32) on more")
    p.add_argument("--float8", default="none", choices=["none", "tensorwise", "rowwise", "rowwise_with_gw_hp"])
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (fullgraph, inductor) and the loss, as torchtitan's --compile.enable;"
                        " the first warm-up step compiles (needs --warmup >= 1)")
    p.add_argument("--json", default="")
    o = p.parse_args()
    if o.compile and o.warmup < 1:
        p.error("--compile compiles in the first step, which must not be timed: pass --warmup 1 or more")
    name = o.model + ("-compile" if o.compile else "")
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if o.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(0)
    model, params, fpt, n_layers, converted = build(o, device, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    try:
        from torchtitan.distributed.utils import clip_grad_norm_
    except ImportError:
        # The eager model on one rank needs only torch (a GPU image has no torchtitan): its parameters are
        # plain tensors, for which torchtitan's clip is torch's.
        if o.model != "eager" or mesh is not None:
            raise
        clip_grad_norm_ = torch.nn.utils.clip_grad_norm_

    torch.manual_seed(rank)  # each rank draws its own batch
    vocab = model.tok_embeddings.weight.shape[0]
    # Drawn on the CPU generator and moved, as titan does: the same tokens on every device.
    x = torch.randint(0, vocab, (o.batch, o.seq_len)).to(device)
    y = torch.randint(0, vocab, (o.batch, o.seq_len)).to(device)
    global_tokens = o.batch * o.seq_len * world
    # Without FSDP: bf16 autocast, as torchtitan's maybe_enable_amp does (always on GPU, as before).
    amp = mesh is None and (device.type == "cuda" or o.mixed_precision == "bf16")

    def token_sum_loss(pred, labels):  # torchtitan's cross_entropy_loss: the sum, divided by the caller
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum")

    loss_fn = torch.compile(token_sum_loss) if o.compile else token_sum_loss  # its "loss" compile component

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
        loss = loss_fn(logits, y) / global_tokens
        loss.backward()
        clip_grad_norm_(list(model.parameters()), 1.0, foreach=True)
        opt.step()
        return loss.item()  # a sync point on CUDA, as titan's forward_backward reads the loss

    from torch._dynamo.utils import counters

    times, warmup_times, losses = [], [], []
    graphs_warm = 0
    for s in range(o.warmup + o.steps):
        if s == o.warmup:
            graphs_warm = counters["stats"]["unique_graphs"]
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        losses.append(step())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        (times if s >= o.warmup else warmup_times).append(time.perf_counter() - t0)
    graphs = counters["stats"]["unique_graphs"]
    state = state_bytes(model, opt)
    step_peak = state + profiled_peak(step) if device.type == "cpu" else 0
    ordered = sorted(times)
    med = ordered[len(ordered) // 2]
    first = warmup_times[0] if warmup_times else times[0]
    compile_s = max(0.0, first - med) if o.compile else 0.0
    tps = o.batch * o.seq_len / med
    peak = 0.0
    if device.type == "cuda":
        try:
            from torchtitan.tools.utils import get_peak_flops

            peak = get_peak_flops(torch.cuda.get_device_name(device))
        except ImportError:
            pass  # no peak table without torchtitan: mfu_declared 0 (titan's JSON has the same card's)
    result = dict(side=name, model=o.model, compiled=o.compile, flavor=o.flavor, n_layers=n_layers, params=params, batch=o.batch, seq_len=o.seq_len,
                  ranks=world, threads=torch.get_num_threads(), device=o.device, mixed_precision=o.mixed_precision,
                  float8=o.float8, float8_converted=converted, step_times=times, warmup_times=warmup_times,
                  first_step_s=first, compile_s=compile_s, graphs_compiled=graphs, graphs_timed=graphs - graphs_warm,
                  step_time_min=ordered[0], step_time_median=med, step_time_max=ordered[-1], tps=tps, losses=losses,
                  flops_per_token=fpt, tflops=fpt * tps / 1e12, mfu_declared=100 * fpt * tps / peak if peak else 0.0,
                  peak_memory_bytes=peak_memory(device), state_bytes=state, step_peak_bytes=step_peak,
                  data_checksum=data_checksum(x, y))
    if rank == 0:
        print(f"{name}: flavor {o.flavor} ({params / 1e6:.1f}M params, {n_layers} layers) B={o.batch} "
              f"S={o.seq_len} ranks={world} threads={torch.get_num_threads()} device={o.device}")
        print(f"{name}: step time min/median/max: {ordered[0]:.3f} / {med:.3f} / {ordered[-1]:.3f} s  "
              f"tokens/s/rank: {tps:.0f}  loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        print(f"{name}: precision {o.mixed_precision}" + (f" + float8 {o.float8} ({converted} Linears)" if converted else "")
              + f"  training state {state / 2**30:.3f} GiB, step allocator peak {step_peak / 2**30:.3f} GiB")
        if o.compile:
            print(f"{name}: compile (first warm-up step, not timed): {first:.2f} s, {compile_s:.2f} s over a timed "
                  f"step; {graphs} Dynamo graphs, {graphs - graphs_warm} of them compiled during the timed steps")
        if o.json:
            with open(o.json, "w") as f:
                json.dump(result, f, indent=2)
    if mesh is not None:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
