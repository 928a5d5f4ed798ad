// SPDX-License-Identifier: BSD-3-Clause
// Passing a recurrence's carry (its state, a convolution's last inputs) along the ranks of a context-parallel group,
// rank r - 1 to rank r, differentiably: rank r starts its tokens from what rank r - 1 ended with, and in backward the
// gradient of what rank r received goes back to rank r - 1 as the gradient of what it sent. One flat message each
// way per layer and forward; rank 0 receives zeros and the last rank sends nothing.
//
//   at::Tensor carry = detail::receive_from_previous(group, numel, options, anchor, differentiable);  // (numel)
//   ... run the local tokens from `carry` ...
//   out = detail::send_to_next(out, packed_final_carry, group, differentiable);
//
// Both ends must agree on `differentiable` (every rank runs the same layer with the same grad mode and parameters):
// a receive with a backward is matched by a send with one. A backward must run over the whole graph
// (torch::autograd::backward); a receive's node runs once its gradient is known, so a backward restricted to
// some inputs that skips it would leave rank r - 1 waiting.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace titan::dist {
class ProcessGroup;
}

namespace titan::nn::detail {

/// What rank r - 1 of `group` sent by send_to_next, `numel` elements with `options` (rank 0: zeros). With
/// `differentiable`, the result's backward sends its gradient (zeros where none reached it) to rank r - 1; `anchor`
/// (a tensor of this forward, e.g. the layer's input) is the node's edge, so that a backward reaches it.
at::Tensor receive_from_previous(const dist::ProcessGroup& group, int64_t numel, const at::TensorOptions& options,
                                 const at::Tensor& anchor, bool differentiable);

/// Sends `carry` (flat, what rank r + 1's receive_from_previous expects) to rank r + 1 and returns `out`
/// (the last rank: sends nothing, returns `out`). With `differentiable`, the result's backward passes out's gradient
/// on and receives carry's from rank r + 1.
at::Tensor send_to_next(const at::Tensor& out, const at::Tensor& carry, const dist::ProcessGroup& group,
                        bool differentiable);

}  // namespace titan::nn::detail
