// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3 with torchtitan's architecture, parameter names and init: multi-head latent attention
// (MLA: low-rank query and key/value projections, RoPE on a separate slice of each head with one
// rotated key shared by all heads, YaRN frequencies), dense SwiGLU blocks first, then blocks whose
// feed-forward is titan's MoE layer (nn/moe.hpp). Built on any device: on meta to count or plan the
// 671B model for free, on a real device to train.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/decoder.hpp"
#include "titan/models/deepseek_v3/args.hpp"
#include "titan/models/memory_model.hpp"
#include "titan/models/multi_token_prediction.hpp"
#include "titan/parallel/plan.hpp"

namespace titan::checkpoint {
class HfAdapter;
}
namespace titan::nn {
struct DraftingModel;
}

namespace titan::deepseek_v3 {

/// The decoder shape of these args (models/decoder_shape.hpp): MoE blocks after the dense ones, MLA's
/// head projections and replicated down-projections for TP.
models::DecoderShape decoder_shape(const DeepSeekV3Args& args);

/// Multi-head latent attention. Shape letters: H heads, NOPE = qk_nope_head_dim, ROPE =
/// qk_rope_head_dim, V = v_head_dim, QR = q_lora_rank, KVR = kv_lora_rank.
class MultiLatentAttention : public nn::AttentionLayer {
 public:
  /// `softmax_mscale` multiplies the softmax scale 1/sqrt(NOPE + ROPE) (YaRN's mscale^2, or 1).
  MultiLatentAttention(const DeepSeekV3Args& args, double softmax_mscale, const at::TensorOptions& options);
  /// x (B, S, D) -> (B, S, D), causal; RoPE tables of ROPE dims.
  at::Tensor forward(const at::Tensor& x, const nn::RopeTables& rope,
                     const nn::AttentionContext& context = {}) const override;
  /// Decoding over a KV cache of every head's keys and values (see nn::AttentionLayer::forward_cached).
  at::Tensor forward_cached(const at::Tensor& x, const nn::RopeTables& rope, const at::Tensor& positions,
                            const at::Tensor& mask, nn::KVCache& cache, int64_t layer) const override;
  /// torchtitan's init: the q and kv projections trunc-normal(0.02), wo trunc-normal(out_std), norms to ones.
  void init_weights(const nn::InitSite& site, double out_std) override;

  int64_t qk_nope_head_dim;
  int64_t qk_rope_head_dim;
  int64_t v_head_dim;
  int64_t kv_lora_rank;
  double softmax_mscale;
  std::shared_ptr<nn::Linear> wq;        // weight (H*(NOPE+ROPE), D); null when q_lora_rank > 0
  std::shared_ptr<nn::Linear> wq_a;      // weight (QR, D); null when q_lora_rank == 0
  std::shared_ptr<nn::RMSNorm> q_norm;   // weight (QR); null when q_lora_rank == 0
  std::shared_ptr<nn::Linear> wq_b;      // weight (H*(NOPE+ROPE), QR); null when q_lora_rank == 0
  std::shared_ptr<nn::Linear> wkv_a;     // weight (KVR+ROPE, D)
  std::shared_ptr<nn::RMSNorm> kv_norm;  // weight (KVR)
  std::shared_ptr<nn::Linear> wkv_b;     // weight (H*(NOPE+V), KVR)
  std::shared_ptr<nn::Linear> wo;        // weight (D, H*V)

 private:
  struct Heads {
    at::Tensor q;  // (B, H, S, NOPE+ROPE), scaled by softmax_mscale
    at::Tensor k;  // (B, H, S, NOPE+ROPE)
    at::Tensor v;  // (B, H, S, NOPE+ROPE), zero-padded past V
  };
  /// The heads of x (B, S, D) at RoPE `positions`.
  Heads heads(const at::Tensor& in, const nn::RopeTables& rope, const at::Tensor& positions) const;
  /// wo of the attended heads (B, H, S, NOPE+ROPE) -> (B, S, D).
  at::Tensor output(const at::Tensor& attended) const;
};

/// What a MultiLatentAttention keeps for backward, for the memory planner (its ModelSpec::attention_memory).
models::AttentionMemory attention_memory(const nn::AttentionLayer& layer, const models::ActivationShapes& x);

class DeepSeekV3 : public models::Decoder {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables (and decides
  /// YaRN unless args.yarn is set) and must not exceed args.max_seq_len. With `modules` (top-level
  /// paths: "tok_embeddings", "layers.N", "norm", "output") only those are built: a pipeline part. With
  /// args.num_nextn_predict_layers > 0 the multi-token prediction modules ("mtp") come with "norm".
  DeepSeekV3(const DeepSeekV3Args& args, int64_t seq_len, const at::TensorOptions& options,
             const std::vector<std::string>& modules = {});

  using Args = DeepSeekV3Args;
  /// Builds the model from its arguments (RoPE tables for args.max_seq_len positions) where `where` says.
  static std::shared_ptr<DeepSeekV3> build(const DeepSeekV3Args& args, const ModelBuild& where = {});

  /// Maps this model to and from Hugging Face DeepseekV3ForCausalLM weights (see hf_adapter.hpp).
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const override;

  /// The decoder's spec with the multi-token prediction modules: one FSDP unit per depth (two with an MoE block:
  /// its routed experts apart), their MoE layers for expert parallelism; tensor parallelism refused with them.
  parallel::ShardingSpec sharding_spec() const override;

  const DeepSeekV3Args& args() const { return args_; }
  /// The model as its own drafter for nn::generate_speculative: the whole model's forward, the mtp modules' drafts.
  /// Refused without mtp.
  nn::DraftingModel drafting_model() const;

  std::shared_ptr<models::MultiTokenPrediction> mtp;  // null without num_nextn_predict_layers or in a part without norm

 protected:
  /// With mtp: h carrying the multi-token prediction loss (the shared embedding and output head).
  at::Tensor after_blocks(const at::Tensor& h, const at::Tensor& tokens,
                          const nn::AttentionContext& context) const override;
  void init_extra_weights(const nn::InitSite& root) override;

 private:
  DeepSeekV3Args args_;
};

}  // namespace titan::deepseek_v3

static_assert(titan::TrainableModel<titan::deepseek_v3::DeepSeekV3>, "DeepSeekV3 must satisfy TrainableModel");
