# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: torchao 0.18's NF4Tensor (QLoRA's 4-bit NormalFloat) on CPU, for tests/quant/nf4_test.cpp.

Writes one safetensors file with, per case `<name>.<dtype>`: the weight `w` and torchao's to_nf4 of it: the packed
level indices (`codes`), the int8 block scalers, the per-group quantisation factors, the scalers' mean, and the
weight it dequantises to (`dequantized`, NF4Tensor.get_original_weight).

  torchao_nf4.py OUT.safetensors
"""
import sys

import torch
from safetensors.torch import save_file
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

out = {}
torch.manual_seed(4321)
cases = {
    # A normal weight of one scaler group (64 x 256 = 16384 elements), and one of three groups with outliers: a
    # block whose absmax is an outlier puts its other elements near level 0.
    "normal": torch.randn(128, 128) * 0.02,
    "outliers": torch.randn(192, 256) * 0.05,
    # Every element of a block near the midpoint of two levels: the nearest is decided by the last bits.
    "ties": torch.full((64, 256), (0.0796 + 0.1609) / 2),
}
cases["outliers"].view(-1)[::997] *= 40.0
cases["ties"].view(-1)[::64] = 1.0  # each block's absmax, so the others are the midpoint after scaling
for name, w32 in cases.items():
    for dtype, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        w = w32.to(dtype).contiguous()
        q = to_nf4(w, block_size=64, scaler_block_size=256)
        key = f"{name}.{tag}"
        out[f"{key}.w"] = w
        out[f"{key}.codes"] = q.quantized_data.contiguous()
        out[f"{key}.scalers"] = q.quantized_scalers.contiguous()
        out[f"{key}.factors"] = q.quantization_factor.contiguous()
        out[f"{key}.mean"] = q.scaler_mean.reshape(()).contiguous()
        out[f"{key}.dequantized"] = q.get_original_weight().contiguous()
save_file(out, sys.argv[1])
