// SPDX-License-Identifier: BSD-3-Clause
// The family's part of the memory planner (planner/memory_plan.hpp): what one block's attention keeps for
// backward. The planner counts everything else of a block itself (norms, the dense or MoE feed-forward,
// routing, expert dispatch) from the built model's modules; attention differs by family (grouped-query
// attention with q/k norms or sinks, DeepSeek-V3's latent attention), so a family whose blocks are not
// nn::Attention registers its own model with its spec (ModelSpec::attention_memory).
//
//   models::AttentionMemory my_attention(const nn::AttentionLayer& layer, const models::ActivationShapes& x) {
//     const auto& a = dynamic_cast<const MyAttention&>(layer);
//     return {.saved = ..., .attention_out = ..., .matmuls = {{x.tokens(), a.dim, a.q_dim}, ...}};
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace titan::nn {
class AttentionLayer;
class Attention;
}  // namespace titan::nn

namespace titan::models {

/// One microbatch on one rank, as the activation model sees it.
struct ActivationShapes {
  /// Sequences per microbatch.
  int64_t b = 1;
  /// Tokens per sequence on this rank (training.seq_len / cp).
  int64_t s = 1;
  /// Tensor-parallel degree: a rank holds n_heads / tp heads.
  int64_t tp = 1;
  /// Context-parallel degree.
  int64_t cp = 1;
  /// Bytes per activation element (the compute dtype).
  int64_t bytes = 4;
  /// CUDA's fused RMSNorm (keeps its input and rstd); CPU's composite keeps its fp32 normalized input too.
  bool fused_norm = false;
  /// Tokens of the microbatch on this rank.
  int64_t tokens() const { return b * s; }
};

/// One nn::linear call of a forward: rows x in_features -> out_features, on this rank.
struct Matmul {
  /// Rows (tokens).
  int64_t rows = 0;
  /// Input features.
  int64_t in = 0;
  /// Output features.
  int64_t out = 0;
};

/// What one block's attention holds on one rank for one microbatch, in bytes.
struct AttentionMemory {
  /// Kept for backward without checkpointing; the attention's input (the norm's output) is the block's.
  int64_t saved = 0;
  /// The attention kernel's output and log-sum-exp: what per-operator checkpointing keeps of attention.
  int64_t attention_out = 0;
  /// Under context parallelism: the whole sequence's keys and values gathered before attention.
  int64_t gathered_kv = 0;
  /// Its nn::linear calls in forward order (per-operator checkpointing keeps every other output).
  std::vector<Matmul> matmuls{};
};

/// A family's attention memory model; models::nn_attention_memory serves nn::Attention.
using AttentionMemoryModel = std::function<AttentionMemory(const nn::AttentionLayer&, const ActivationShapes&)>;

/// Bytes an RMSNorm over `rows` rows of `width` keeps for backward, its input included: the input and
/// rstd (fp32 per row); CPU's composite also its fp32 normalized input (and, for a 2-byte input, its fp32 copy).
int64_t rms_norm_saved(int64_t rows, int64_t width, const ActivationShapes& x);

/// nn::Attention's (Llama 3, Qwen3, gpt-oss): q, k, v projections (q/k norms), RoPE, SDPA (sinks and a
/// window merge into its log-sum-exp, keeping the same tensors), wo.
AttentionMemory nn_attention_memory(const nn::AttentionLayer& layer, const ActivationShapes& x);

}  // namespace titan::models
