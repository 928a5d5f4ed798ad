// SPDX-License-Identifier: BSD-3-Clause
// Causal attention with learned per-head sinks and an optional sliding window (gpt-oss). A sink is one
// more logit per head in every query row's softmax denominator, with no value: row i of head h attends
// with p_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)), so a row may give part of its weight to nothing.
// A window of W lets query i see keys i - W < j <= i (itself and W - 1 before it: torchtitan's and HF's).
//
// Computed by the SDPA kernel that also returns each row's log-sum-exp (nn/attention_blocks), then merged
// with the sink as context parallelism merges blocks: lse' = logaddexp(lse, sink), out' = out exp(lse - lse').
// Backward is that kernel's backward given out' and lse' (the probabilities with the sink's share in the
// normaliser), plus the sink's gradient -sum_i exp(sink - lse'_i) (dO_i . O'_i).
#pragma once

#include <ATen/core/Tensor.h>

#include "titan/nn/attention_context.hpp"

namespace titan::nn {

/// q (B, H, S, HD), k and v (B, KVH, S, HD), sinks (H) or undefined (no sinks), window 0 (every earlier
/// key) or > 0 -> (B, H, S, HD). Within documents when `context` has document ids; differentiable in q, k,
/// v and sinks. Refuses a context-parallel split (sinks and windows are not built into it).
at::Tensor sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                          int64_t window, const AttentionContext& context = {});

/// The same over a KV cache (inference, no autograd): q (B, H, S, HD) are the last S of the T cached
/// columns k, v (B, KVH, T, HD); mask (B or 1, 1, S, T) bool from the cache; the window counts columns.
at::Tensor cached_sink_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                 const at::Tensor& sinks, int64_t window);

}  // namespace titan::nn
