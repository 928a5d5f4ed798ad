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

#include "titan/models/deepseek_v3/args.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/attention_context.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/moe.hpp"
#include "titan/nn/rope.hpp"
#include "titan/parallel/plan.hpp"

namespace titan {
struct JobConfig;
}
namespace titan::checkpoint {
class HfAdapter;
}
namespace titan::dist {
class Mesh;
}

namespace titan::deepseek_v3 {

/// Multi-head latent attention. Shape letters: H heads, NOPE = qk_nope_head_dim, ROPE =
/// qk_rope_head_dim, V = v_head_dim, QR = q_lora_rank, KVR = kv_lora_rank.
class MultiLatentAttention : public torch::nn::Module, public nn::ContextParallelCapable {
 public:
  /// `softmax_mscale` multiplies the softmax scale 1/sqrt(NOPE + ROPE) (YaRN's mscale^2, or 1).
  MultiLatentAttention(const DeepSeekV3Args& args, double softmax_mscale, const at::TensorOptions& options);
  /// x (B, S, D) -> (B, S, D), causal; RoPE tables of ROPE dims.
  at::Tensor forward(const at::Tensor& x, const nn::RopeTables& rope) const;
  /// torchtitan's init: the q and kv projections trunc-normal(0.02), wo trunc-normal(out_std), norms to ones.
  void init_weights(double out_std);

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
};

class TransformerBlock : public torch::nn::Module {
 public:
  TransformerBlock(int64_t layer_id, const DeepSeekV3Args& args, double softmax_mscale,
                   const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const nn::RopeTables& rope) const;  // (B, S, D) -> (B, S, D)
  void init_weights();

  int64_t layer_id;
  double init_std;  // std of this block's output projections: 0.02 / sqrt(2 * (layer_id + 1))
  std::shared_ptr<nn::RMSNorm> attention_norm;
  std::shared_ptr<MultiLatentAttention> attention;
  std::shared_ptr<nn::RMSNorm> ffn_norm;
  std::shared_ptr<nn::FeedForward> feed_forward;  // the first n_dense_layers blocks; null in MoE blocks
  std::shared_ptr<nn::MoE> moe;                   // the other blocks; null in dense blocks
};

class DeepSeekV3 : public torch::nn::Module {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables (and decides
  /// YaRN unless args.yarn is set) and must not exceed args.max_seq_len. With `modules` (top-level
  /// paths: "tok_embeddings", "layers.N", "norm", "output") only those are built: a pipeline part.
  DeepSeekV3(const DeepSeekV3Args& args, int64_t seq_len, const at::TensorOptions& options,
             const std::vector<std::string>& modules = {});

  /// Builds from the job config (model.name deepseek_v3, model.flavor, training.seq_len) on `device`
  /// (default meta); `vocab_size` > 0 overrides the flavor's; `modules` as in the constructor.
  static std::shared_ptr<DeepSeekV3> build(const JobConfig& config, int64_t vocab_size = 0,
                                           const at::Device& device = at::kMeta,
                                           const std::vector<std::string>& modules = {});

  /// tokens (B, S) int64 -> logits (B, S, V) in the parameter dtype.
  at::Tensor forward(const at::Tensor& tokens) const;
  /// Runs `modules` in order on x (tokens before "tok_embeddings", hidden states (B, S, D) after it,
  /// logits after "output"): one pipeline stage's forward.
  at::Tensor forward_part(const at::Tensor& x, const std::vector<std::string>& modules) const;
  /// torchtitan's init scheme (under the current init seed); zeroes the MoE expert biases.
  void init_weights();
  /// Every parameter once, in registration order.
  std::vector<at::Tensor> unique_parameters() const;
  /// Number of parameters, every expert counted.
  int64_t num_params() const;
  /// torchtitan's training FLOPs per token for MoE models: 6 * (active non-embedding parameters:
  /// dense ones, routers, shared experts, and top_k / num_experts of the routed experts) +
  /// 6 * L * H * (NOPE + ROPE + V) * S.
  int64_t num_flops_per_token(int64_t seq_len) const;
  /// FSDP units per block (see models/deepseek_v3/parallelize.hpp).
  parallel::ParallelPlan parallel_plan(const JobConfig& config, const dist::Mesh& mesh) const;
  /// Maps this model to and from Hugging Face DeepseekV3ForCausalLM weights (see hf_adapter.hpp).
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const;
  /// The MoE layers this model (part) holds, in block order: for update_expert_bias and expert load.
  std::vector<std::shared_ptr<nn::MoE>> moe_layers() const;

  int64_t vocab_size() const { return args_.vocab_size; }
  const DeepSeekV3Args& args() const { return args_; }
  int64_t seq_len() const { return seq_len_; }

  std::shared_ptr<nn::Embedding> tok_embeddings;          // weight (V, D); null in a part without it
  std::vector<std::shared_ptr<TransformerBlock>> layers;  // registered as layers.<layer_id>; a part's only
  std::shared_ptr<nn::RMSNorm> norm;                      // weight (D); null in a part without it
  std::shared_ptr<nn::Linear> output;                     // weight (V, D); null in a part without it

 private:
  DeepSeekV3Args args_;
  int64_t seq_len_;
  nn::RopeTables rope_;  // freqs_cis (S, ROPE/2), not parameters
};

}  // namespace titan::deepseek_v3

#include "titan/models/trainable_model.hpp"
static_assert(titan::TrainableModel<titan::deepseek_v3::DeepSeekV3>, "DeepSeekV3 must satisfy TrainableModel");
