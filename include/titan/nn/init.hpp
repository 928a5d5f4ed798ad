// SPDX-License-Identifier: BSD-3-Clause
// Weight initialisers matching PyTorch's (torch.nn.init) draw-for-draw, for torchtitan's init scheme.
#pragma once

#include <ATen/core/Tensor.h>

namespace titan::nn {

/// In-place truncated normal N(mean, std) cut at the absolute bounds [a, b] (torch.nn.init
/// semantics: a and b are NOT in units of std). Uses inverse-CDF sampling like PyTorch.
void trunc_normal_(at::Tensor& t, double mean, double std, double a, double b);

/// In-place N(mean, std).
void normal_(at::Tensor& t, double mean, double std);

}  // namespace titan::nn
