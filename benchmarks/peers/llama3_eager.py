# SPDX-License-Identifier: BSD-3-Clause
"""The Python peer of bench_step_throughput: the same Llama 3 (torchtitan's architecture: RMSNorm, RoPE
with Llama 3.1 scaling on adjacent pairs, GQA through SDPA, SwiGLU, no biases) and the same training step
(token-mean cross-entropy, global-norm clipping, fused AdamW) in plain PyTorch eager mode.

    python benchmarks/peers/llama3_eager.py --flavor debugmodel --seq-len 256 --batch 8 --steps 5
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

FLAVORS = {
    "debugmodel": dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab=2048, multiple_of=256, mult=None),
    "100M": dict(dim=640, n_layers=12, n_heads=10, n_kv_heads=5, vocab=32768, multiple_of=256, mult=None),
    # Llama 3.2 1B's shape, untied (the torchtitan peer's Transformer has no weight tying).
    "1B": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab=128256, multiple_of=1024, mult=1.5),
    "8B": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab=128256, multiple_of=1024, mult=1.3),
}


def ffn_hidden(dim, multiple_of, mult):
    hidden = int(2 * (4 * dim) / 3)
    if mult is not None:
        hidden = int(mult * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def rope_tables(head_dim, seq_len, theta=500000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4:
            out.append(f)
        elif wavelen > 8192:
            out.append(f / 8)
        else:
            smooth = (8192 / wavelen - 1) / 3
            out.append((1 - smooth) * f / 8 + smooth * f)
    angles = torch.outer(torch.arange(seq_len).float(), torch.tensor(out))
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x, freqs_cis):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis[: x.shape[1]].unsqueeze(1)).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        d, h, kv = a["dim"], a["n_heads"], a["n_kv_heads"]
        self.h, self.kv, self.hd = h, kv, d // h
        self.wq = nn.Linear(d, h * self.hd, bias=False)
        self.wk = nn.Linear(d, kv * self.hd, bias=False)
        self.wv = nn.Linear(d, kv * self.hd, bias=False)
        self.wo = nn.Linear(h * self.hd, d, bias=False)
        f = ffn_hidden(d, a["multiple_of"], a["mult"])
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.attention_norm = nn.RMSNorm(d, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(d, eps=1e-5)

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        y = self.attention_norm(x)
        q = apply_rope(self.wq(y).view(b, s, self.h, self.hd), freqs_cis).transpose(1, 2)
        k = apply_rope(self.wk(y).view(b, s, self.kv, self.hd), freqs_cis).transpose(1, 2)
        v = self.wv(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        h = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        z = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(z)) * self.w3(z))


class Llama3(nn.Module):
    def __init__(self, a, seq_len):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a["vocab"], a["dim"])
        self.layers = nn.ModuleList(Block(a) for _ in range(a["n_layers"]))
        self.norm = nn.RMSNorm(a["dim"], eps=1e-5)
        self.output = nn.Linear(a["dim"], a["vocab"], bias=False)
        self.register_buffer("freqs_cis", rope_tables(a["dim"] // a["n_heads"], seq_len), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """torchtitan's Llama 3 initialisation (depth_init): embeddings N(0, 1); wq, wk, wv, w1 truncated
        normal with std 0.02; wo, w2, w3 with 0.02 / sqrt(2 (layer + 1)); output with dim^-0.5, cut at 3 std;
        norms ones. The same scales as titan's and torchtitan's models, so the step-1 losses of the three
        sides agree (compare.py checks it); torch's default Linear init gives a loss 0.3 lower."""
        nn.init.normal_(self.tok_embeddings.weight)
        for i, block in enumerate(self.layers):
            std = 0.02 / (2 * (i + 1)) ** 0.5
            for w, s in [(block.wq, 0.02), (block.wk, 0.02), (block.wv, 0.02), (block.wo, std), (block.w1, 0.02),
                         (block.w2, std), (block.w3, std)]:
                nn.init.trunc_normal_(w.weight, mean=0.0, std=s)
        std = self.output.weight.shape[1] ** -0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default="debugmodel", choices=sorted(FLAVORS))
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default="")
    o = p.parse_args()
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    torch.manual_seed(0)
    a = FLAVORS[o.flavor]
    model = Llama3(a, o.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    x = torch.randint(0, a["vocab"], (o.batch, o.seq_len))
    y = torch.randint(0, a["vocab"], (o.batch, o.seq_len))
    times = []
    for s in range(o.warmup + o.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum") / y.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        if s >= o.warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    tps = o.batch * o.seq_len / med
    print(f"peer: flavor {o.flavor} B={o.batch} S={o.seq_len} threads={torch.get_num_threads()}")
    print(f"peer: step time min/median/max: {times[0]:.3f} / {med:.3f} / {times[-1]:.3f} s  tokens/s: {tps:.0f}")
    if o.json:
        with open(o.json, "w") as f:
            json.dump(dict(flavor=o.flavor, batch=o.batch, seq_len=o.seq_len, step_time_min=times[0],
                           step_time_median=med, step_time_max=times[-1], tps=tps), f, indent=2)


if __name__ == "__main__":
    main()
