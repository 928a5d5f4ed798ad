// SPDX-License-Identifier: BSD-3-Clause
// The families' part of the memory planner (models/memory_model.hpp): an RMSNorm's saved tensors and
// nn::Attention's, by the tensors autograd saves for each op titan's layers run, checked against titan's
// memory tracker on CPU (docs/memory_planner.md).
#include "titan/models/memory_model.hpp"

#include "titan/core/error.hpp"
#include "titan/nn/attention.hpp"

namespace titan::models {

int64_t rms_norm_saved(int64_t rows, int64_t width, const ActivationShapes& x) {
  const int64_t n = rows * width;
  // CPU's composite rms_norm keeps its normalized input in fp32 (and, for a 2-byte input, the fp32 copy
  // too); CUDA's fused kernel keeps the input and rstd only.
  const int64_t extra = x.fused_norm ? 0 : n * (x.bytes == 4 ? 4 : 6);
  return n * x.bytes + rows * 4 + extra;
}

AttentionMemory nn_attention_memory(const nn::AttentionLayer& layer, const ActivationShapes& x) {
  const auto* attention = dynamic_cast<const nn::Attention*>(&layer);
  TITAN_CHECK_VALUE(attention != nullptr,
                    "[titan::models::nn_attention_memory] expected the blocks' attention to be an nn::Attention or the "
                    "family to register its memory model, got a {}. Set ModelSpec::attention_memory.",
                    layer.name());
  const int64_t T = x.tokens();
  const int64_t a = x.bytes;
  const int64_t H = attention->n_heads / x.tp;
  const int64_t KVH = attention->n_kv_heads / x.tp;
  const int64_t HD = attention->head_dim;
  const int64_t D = attention->wq->weight.size(1);
  const int64_t lse = x.b * H * x.s * 4;  // SDPA's log-sum-exp (B, H, S) fp32
  AttentionMemory m;
  // Rotated q and k and v (SDPA keeps them); SDPA's output is laid out (B, S, H, HD), so wo's input is a
  // view of it; RoPE keeps only its (constant) table, the complex multiply's gradient needs the other
  // factor alone. Sinks and a window merge into the kernel's output and log-sum-exp: the same tensors.
  m.attention_out = T * H * HD * a + lse;
  m.saved = T * (H + 2 * KVH) * HD * a + m.attention_out;
  // Qwen3's q/k norms over each head: each keeps its input (the projection's output) and its statistics.
  if (attention->q_norm) m.saved += rms_norm_saved(T * H, HD, x) + rms_norm_saved(T * KVH, HD, x);
  if (x.cp > 1) m.gathered_kv = 2 * T * x.cp * KVH * HD * a;  // the whole sequence's K and V
  m.matmuls = {{T, D, H * HD}, {T, D, KVH * HD}, {T, D, KVH * HD}, {T, H * HD, D}};
  return m;
}

}  // namespace titan::models
