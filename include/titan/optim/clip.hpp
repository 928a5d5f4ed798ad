// SPDX-License-Identifier: BSD-3-Clause
// Global-norm gradient clipping. The returned norm is the pre-clip total L2 norm (logged as
// grad_norm). Sharded parameters add a cross-rank reduction of the squared norm (distributed runtime).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace titan {

namespace dist {
class Mesh;
}

/// Total L2 norm of the defined gradients of `params`, as a () float32 tensor. With a mesh, gradients
/// of sharded parameters (parallel::sharded_param) have their squared norms summed over the mesh
/// axes they are sharded on, so every rank gets the norm of the whole model.
at::Tensor grad_norm(const std::vector<at::Tensor>& params, const dist::Mesh* mesh = nullptr);

/// Scales gradients in place so their total norm is at most `max_norm` (<= 0 disables the scaling);
/// returns the pre-clip norm. Uses torch's coefficient max_norm / (norm + 1e-6) clamped to 1. `copies`: parameters of
/// `params` whose gradient another rank's parameter holds too (the last pipeline stage's copy of the first stage's
/// embedding): scaled with the rest, left out of the norm, which counts the weight once.
double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm, const dist::Mesh* mesh = nullptr,
                       const std::vector<at::Tensor>& copies = {});

}  // namespace titan
