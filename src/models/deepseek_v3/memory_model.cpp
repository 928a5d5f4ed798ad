// SPDX-License-Identifier: BSD-3-Clause
// Multi-head latent attention's memory for the planner (models/memory_model.hpp): one term per tensor
// autograd keeps in MultiLatentAttention::forward (model.cpp), checked against the memory tracker on CPU
// (tests/planner/memory_measured_moe_test.cpp).
#include "titan/core/error.hpp"
#include "titan/models/deepseek_v3/model.hpp"

namespace titan::deepseek_v3 {

models::AttentionMemory attention_memory(const nn::AttentionLayer& layer, const models::ActivationShapes& x) {
  const auto* mla = dynamic_cast<const MultiLatentAttention*>(&layer);
  TITAN_CHECK_VALUE(mla != nullptr,
                    "[titan::deepseek_v3::attention_memory] expected a MultiLatentAttention, got a {}. Plan a "
                    "deepseek_v3 model with model.name deepseek_v3.",
                    layer.name());
  const int64_t T = x.tokens();
  const int64_t a = x.bytes;
  const int64_t NOPE = mla->qk_nope_head_dim;
  const int64_t ROPE = mla->qk_rope_head_dim;
  const int64_t V = mla->v_head_dim;
  const int64_t KVR = mla->kv_lora_rank;
  const int64_t D = mla->wkv_a->weight.size(1);
  const int64_t H = mla->wkv_b->weight.size(0) / (NOPE + V) / x.tp;  // heads on this rank (wkv_b is colwise)
  const int64_t HD = NOPE + ROPE;                                    // q/k head dim; v is zero-padded to it
  const int64_t lse = x.b * H * x.s * 4;                             // SDPA's log-sum-exp (B, H, S) fp32
  models::AttentionMemory m;
  m.attention_out = T * H * HD * a + lse;
  // SDPA keeps q (after RoPE and mscale), k (the latent's keys with the shared rotated key) and the
  // padded v, each (T, H, NOPE+ROPE), its output and log-sum-exp. RoPE, cat, the padding and the scalar
  // mscale keep nothing of their own.
  m.saved = 3 * T * H * HD * a + m.attention_out;
  // The key/value latent: kv_norm reads a slice of wkv_a's output (T, KVR+ROPE) and so keeps all of it,
  // with its statistics and fp32 normalized input; wkv_b keeps the norm's output (T, KVR).
  m.saved += models::rms_norm_saved(T, KVR, x) + T * ROPE * a + T * KVR * a;
  // wo reads the first V of each head's output: a copy (T, H*V).
  m.saved += T * H * V * a;
  if (mla->wq_a) {
    // The query latent: q_norm keeps wq_a's output (T, QR) with its statistics, wq_b the norm's output.
    const int64_t QR = mla->wq_a->weight.size(0);
    m.saved += models::rms_norm_saved(T, QR, x) + T * QR * a;
    m.matmuls = {{T, D, QR}, {T, QR, H * HD}};
  } else {
    m.matmuls = {{T, D, H * HD}};
  }
  m.matmuls.insert(m.matmuls.end(), {{T, D, KVR + ROPE}, {T, KVR, H * (NOPE + V)}, {T, H * V, D}});
  return m;
}

}  // namespace titan::deepseek_v3
