# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: torchao 0.18's float8 training on CPU, for tests/float8/oracle_test.cpp.

Writes one safetensors file with, per case `<recipe>.<emulate|scaled_mm>.<dtype>`: the inputs (x, w,
grad_out) and torchao's Float8Linear output, input gradient and weight gradient; the same per case
`<recipe>.<emulate|scaled_mm>.autocast_bf16`, fp32 x and w with the forward under CPU autocast (bf16);
and, per cast case `cast.<dtype>.<granularity>...`, torchao's float8 bytes (as uint8) and scales.

  torchao_float8.py OUT.safetensors
"""
import contextlib
import dataclasses
import sys
from unittest import mock

import torch
from safetensors.torch import save_file
from torchao.float8 import Float8LinearConfig
from torchao.float8.config import ScalingGranularity
from torchao.float8.float8_linear import Float8Linear
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
from torchao.float8.float8_training_tensor import LinearMMConfig

# torch's CPU _scaled_mm (tensorwise) is an fp32 emulation, except on CPUs with AMX-INT8 where it calls
# oneDNN's fp8 matmul instead. titan's CPU float8 GEMM is that emulation on every CPU (src/float8/linear.cpp),
# so the oracle asks for it too: with oneDNN off, torchao's _scaled_mm computes the same arithmetic everywhere.
torch.backends.mkldnn.enabled = False

out = {}
torch.manual_seed(1234)

# Float8Linear: (B, S, K) @ (N, K)^T, dims multiples of 16 (torchao's requirement).
B, S, K, N = 2, 24, 64, 48
cases = [("tensorwise", False), ("tensorwise", True), ("rowwise", True), ("rowwise_with_gw_hp", True)]
for dtype in (torch.float32, torch.bfloat16):
    tag = "f32" if dtype == torch.float32 else "bf16"
    for recipe, emulate in cases:
        name = f"{recipe}.{'emulate' if emulate else 'scaled_mm'}.{tag}"
        x = (torch.randn(B, S, K) * 2.0).to(dtype)
        w = (torch.randn(N, K) / 8.0).to(dtype)
        grad_out = (torch.randn(B, S, N) * 1e-3).to(dtype)
        linear = torch.nn.Linear(K, N, bias=False, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(w)
        config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
        f8 = Float8Linear.from_float(linear, config=config)
        xr = x.clone().requires_grad_(True)
        y = f8(xr)
        y.backward(grad_out)
        for key, t in (("x", x), ("w", w), ("grad_out", grad_out), ("y", y.detach()), ("grad_x", xr.grad),
                       ("grad_w", f8.weight.grad)):
            out[f"{name}.{key}"] = t.contiguous()


@contextlib.contextmanager
def autocast_of_cpu_seen_as_gpu():
    """torchao 0.18's Float8Linear.forward casts its input to the autocast dtype only under CUDA autocast
    (it asks torch.is_autocast_enabled() and torch.get_autocast_gpu_dtype(), which read CUDA's state).
    titan casts under the autocast of the input's device; here those two read CPU's autocast, so that
    torchao's own forward makes on CPU the cast it makes on a GPU."""
    enabled, dtype = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    is_enabled = torch.is_autocast_enabled
    with mock.patch.object(torch, "is_autocast_enabled", lambda *a: is_enabled(*a) if a else enabled), \
            mock.patch.object(torch, "get_autocast_gpu_dtype", lambda: dtype):
        yield


# Float8Linear under CPU autocast (bf16): fp32 input and weight; the input is cast to bf16 before its float8
# cast, the weight is cast from fp32, and the output is bf16. Backward runs outside autocast, as a training
# step runs it.
for recipe, emulate in cases:
    name = f"{recipe}.{'emulate' if emulate else 'scaled_mm'}.autocast_bf16"
    x = torch.randn(B, S, K) * 2.0
    w = torch.randn(N, K) / 8.0
    grad_out = (torch.randn(B, S, N) * 1e-3).to(torch.bfloat16)
    linear = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        linear.weight.copy_(w)
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    f8 = Float8Linear.from_float(linear, config=config)
    xr = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16), autocast_of_cpu_seen_as_gpu():
        y = f8(xr)
    assert y.dtype == torch.bfloat16, y.dtype
    y.backward(grad_out)
    for key, t in (("x", x), ("w", w), ("grad_out", grad_out), ("y", y.detach()), ("grad_x", xr.grad),
                   ("grad_w", f8.weight.grad)):
        out[f"{name}.{key}"] = t.contiguous()

# Casts: torchao's hp_tensor_to_float8_dynamic, tensorwise and axiswise along either dim.
mm_config = LinearMMConfig()
for dtype in (torch.float32, torch.bfloat16):
    tag = "f32" if dtype == torch.float32 else "bf16"
    x = (torch.randn(40, 80) * torch.exp(torch.randn(40, 80) * 3.0)).to(dtype)
    out[f"cast.{tag}.x"] = x
    for f8_name, f8_dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        for pow2 in (False, True):
            for gran, dim in (("tensorwise", None), ("rows", -1), ("cols", 0)):
                t = hp_tensor_to_float8_dynamic(
                    x, f8_dtype, mm_config,
                    scaling_granularity=ScalingGranularity.TENSORWISE if dim is None else ScalingGranularity.AXISWISE,
                    axiswise_dim=dim, round_scales_to_power_of_2=pow2)
                key = f"cast.{tag}.{f8_name}.{gran}.{'pow2' if pow2 else 'exact'}"
                out[f"{key}.data"] = t._data.contiguous().view(torch.uint8)
                out[f"{key}.scale"] = t._scale.reshape(-1).contiguous()

save_file(out, sys.argv[1])
