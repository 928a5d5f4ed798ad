# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: torch.optim.Muon (torch 2.11), for tests/optim/muon_test.cpp.

  torch_muon.py OUT.safetensors CASES.json

CASES.json: {"shapes": [[rows, cols], ...], "steps": N, "no_grad": [[step, i], ...], "cases": [{"lr", "weight_decay",
"momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn"}, ...]}. Writes the initial parameters
`param.<i>`, each step's gradients `grad.<s>.<i>` (the same for every case; none for the no_grad pairs), per case c the
parameters after each step `case<c>.step<s>.<i>` and the final momentum buffers `case<c>.momentum.<i>`, and `ns.<i>`:
torch's Newton-Schulz of grad.0.<i> with case 0's settings.
"""
import json
import sys

import torch
from safetensors.torch import save_file
from torch.optim._muon import _zeropower_via_newtonschulz

# One thread, as the tests run (ctest sets OMP_NUM_THREADS=1): the same GEMM blocking on both sides.
torch.set_num_threads(1)

out_path, spec_path = sys.argv[1], sys.argv[2]
with open(spec_path, encoding="utf-8") as f:
    spec = json.load(f)
gen = torch.Generator().manual_seed(2026)
shapes = spec["shapes"]
params = [torch.randn(*shape, generator=gen) * 0.1 for shape in shapes]
grads = [[torch.randn(*shape, generator=gen) for shape in shapes] for _ in range(spec["steps"])]
no_grad = {tuple(pair) for pair in spec["no_grad"]}

out = {f"param.{i}": p for i, p in enumerate(params)}
for s, step_grads in enumerate(grads):
    out.update({f"grad.{s}.{i}": g for i, g in enumerate(step_grads) if (s, i) not in no_grad})

for c, case in enumerate(spec["cases"]):
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.Muon(ps, lr=case["lr"], weight_decay=case["weight_decay"], momentum=case["momentum"],
                           nesterov=case["nesterov"], ns_coefficients=tuple(case["ns_coefficients"]), eps=case["eps"],
                           ns_steps=case["ns_steps"], adjust_lr_fn=case["adjust_lr_fn"])
    for s, step_grads in enumerate(grads):
        for i, (p, g) in enumerate(zip(ps, step_grads)):
            p.grad = None if (s, i) in no_grad else g.clone()
        opt.step()
        out.update({f"case{c}.step{s}.{i}": p.detach().clone() for i, p in enumerate(ps)})
    out.update({f"case{c}.momentum.{i}": opt.state[p]["momentum_buffer"].clone() for i, p in enumerate(ps)})

first = spec["cases"][0]
for i, g in enumerate(grads[0]):
    ns = _zeropower_via_newtonschulz(g, tuple(first["ns_coefficients"]), first["ns_steps"], first["eps"])
    out[f"ns.{i}"] = ns.contiguous()

save_file(out, out_path)
