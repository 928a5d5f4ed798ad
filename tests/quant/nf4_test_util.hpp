// SPDX-License-Identifier: BSD-3-Clause
// NF4's proven element bound, shared by the NF4 and QLoRA tests.
#pragma once

#include <ATen/ATen.h>

#include "titan/quant/nf4.hpp"

namespace titan::test {

/// How far each dequantised element of `w` (2-D, default blocks) may lie from it. An element x of a block with absmax
/// m is stored as level(x/m) * m', m' the double-quantised absmax: |x - level * m'| <= m * g/2 + |m - m'|, g/2 half
/// the widest gap between neighbouring levels (-1 to -0.6962) and |m - m'| <= one int8 step of its group's factor,
/// 2 absmax_group / 256 (half a step of rounding, but the group's largest scaler lands on +128, clamped to 127: a whole
/// step); widened by fp32 rounding (1e-5 relative, 1e-9 absolute).
inline at::Tensor nf4_element_bound(const at::Tensor& w) {             // (out, in) -> (out, in)
  const at::Tensor m = std::get<0>(w.reshape({-1, 64}).abs().max(1));  // (numel / 64) block absmaxes
  const at::Tensor centred = m - m.mean();
  const at::Tensor group_step = std::get<0>(centred.view({-1, 256}).abs().max(1)) * 2 / 256;        // (numel / 16384)
  const at::Tensor levels = quant::nf4_levels(at::kFloat);                                          // (16)
  const double half_gap = (levels.slice(0, 1) - levels.slice(0, 0, 15)).max().item<double>() / 2;   // 0.1519
  const at::Tensor block = (m * half_gap + group_step.repeat_interleave(256)) * (1 + 1e-5) + 1e-9;  // (numel / 64)
  return block.unsqueeze(-1).expand({m.size(0), 64}).reshape(w.sizes());
}

}  // namespace titan::test
