// SPDX-License-Identifier: BSD-3-Clause
// Causal (and document-masked) attention of a sequence, whole or sharded over context-parallel
// ranks. Under CP a rank holds some chunks of the sequence's queries, keys and values; the attention
// of its queries against every key is computed exactly, block by block with the SDPA flash kernels
// (which return each row's log-sum-exp), and the partial outputs merged by their log-sum-exp. Fully
// masked block pairs are skipped. Backward runs the same kernels' backward with the merged output and
// log-sum-exp, and sends each key/value gradient back to the rank that holds the key/value.
//
// Layouts: q (B, H, S, HD), k and v (B, KVH, S, HD) with H a multiple of KVH (grouped-query
// attention: only the KVH heads travel between ranks), S the local tokens.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

#include "titan/nn/attention_context.hpp"

namespace titan::nn {

/// Attention of the tokens `context` describes: causal over the whole sequence, within documents when
/// the context has document ids, across the cp ranks when it has a sharding.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionContext& context = {});

/// This rank's queries against the whole sharded sequence (exact; differentiable). `document_ids`
/// (B, S_whole) int64 or undefined.
at::Tensor context_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const SequenceSharding& sharding, const at::Tensor& document_ids = {});

/// Attention of head-sharded q (B, H', S, HD), k and v (B, KVH', S, HD) over the whole sequence: `head_begin` is
/// the first of the local heads' indices among the attention's heads (for per-head parameters such as sinks),
/// `whole` the context of the whole sequence (document ids; no sharding).
using WholeSequenceAttention = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                        int64_t head_begin, const AttentionContext& whole)>;

/// Ulysses context parallelism: q (B, H, L, HD), k and v (B, KVH, L, HD) of this rank's tokens are exchanged by
/// an all-to-all over the cp group for every token of H/cp heads, attended by `attend` as on one device, and the
/// output (B, H/cp, S, HD) exchanged back to (B, H, L, HD). H must divide by cp; KV heads that cp does not divide
/// are repeated first. Differentiable (the backward of an all-to-all is the reverse all-to-all).
at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const SequenceSharding& sharding, const at::Tensor& document_ids,
                             const WholeSequenceAttention& attend);

/// The one-device reference: SDPA over the whole sequence, causal, within documents when
/// `document_ids` (B, S) is defined.
at::Tensor local_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& document_ids = {});

}  // namespace titan::nn
