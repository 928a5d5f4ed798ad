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

/// The one-device reference: SDPA over the whole sequence, causal, within documents when
/// `document_ids` (B, S) is defined.
at::Tensor local_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& document_ids = {});

}  // namespace titan::nn
