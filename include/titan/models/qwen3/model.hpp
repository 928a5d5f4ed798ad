// SPDX-License-Identifier: BSD-3-Clause
// Qwen3 and Qwen3-MoE with torchtitan's architecture, parameter names (`tok_embeddings.weight`,
// `layers.N.attention.{wq,wk,wv,wo,q_norm,k_norm}.weight`, `layers.N.feed_forward.w1.weight` or
// `layers.N.moe.{router.gate.weight,experts.w1,...}`, `norm.weight`, `output.weight`) and init
// scheme, built from titan's layers: nn::Attention with head_dim and q/k norm, nn::FeedForward,
// nn::MoE. One difference from torchtitan's Qwen3: RoPE rotates adjacent pairs (titan's nn::rope)
// where torchtitan and HF rotate halves, so wq/wk rows and the q/k norm weights are stored permuted
// within each head; the HF adapter converts (the model computes the same function).
//
//   auto model = titan::qwen3::Qwen3::build(config, 0, at::kCPU);  // model.name "qwen3"
//   model->init_weights();
//   at::Tensor logits = model->forward(tokens);                     // (B, S) -> (B, S, V)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/qwen3/args.hpp"
#include "titan/nn/attention.hpp"
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

namespace titan::qwen3 {

class TransformerBlock : public torch::nn::Module {
 public:
  /// Init-generator streams one block's init_weights takes (a part skips them for absent blocks).
  static int64_t init_streams(const Qwen3Args& args, int64_t layer_id);
  TransformerBlock(int64_t layer_id, const Qwen3Args& args, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const nn::RopeTables& rope) const;  // (B, S, D) -> (B, S, D)
  void init_weights();

  int64_t layer_id;
  double init_std;  // std of this block's output projections (wo, w2, w3, router gate)
  std::shared_ptr<nn::RMSNorm> attention_norm;
  std::shared_ptr<nn::Attention> attention;
  std::shared_ptr<nn::RMSNorm> ffn_norm;
  std::shared_ptr<nn::FeedForward> feed_forward;  // dense blocks; null in an MoE block
  std::shared_ptr<nn::MoE> moe;                   // MoE blocks; null in a dense block
};

class Qwen3 : public torch::nn::Module {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables and must not
  /// exceed args.max_seq_len. With `modules` (top-level paths: "tok_embeddings", "layers.N", "norm",
  /// "output") only those are built: a pipeline rank's part, with the whole model's names.
  Qwen3(const Qwen3Args& args, int64_t seq_len, const at::TensorOptions& options,
        const std::vector<std::string>& modules = {});

  /// Builds from the job config (model.name "qwen3", model.flavor, training.seq_len) on `device`
  /// (default meta); `vocab_size` > 0 overrides the flavor's; `modules` as in the constructor.
  static std::shared_ptr<Qwen3> build(const JobConfig& config, int64_t vocab_size = 0,
                                      const at::Device& device = at::kMeta,
                                      const std::vector<std::string>& modules = {});

  /// tokens (B, S) int64 -> logits (B, S, V) in the parameter dtype.
  at::Tensor forward(const at::Tensor& tokens) const;
  /// Runs `modules` in order on x: tokens (B, S) before "tok_embeddings", hidden states (B, S, D)
  /// after it; "output" returns the logits (B, S, V). One pipeline stage's forward.
  at::Tensor forward_part(const at::Tensor& x, const std::vector<std::string>& modules) const;
  /// torchtitan's init scheme (under the current RNG state). A part fills exactly the values its
  /// modules have in the whole model.
  void init_weights();
  /// Parameters without duplicates (tied weights once), in registration order.
  std::vector<at::Tensor> unique_parameters() const;
  /// Number of parameters, every expert included (tied weights counted once).
  int64_t num_params() const;
  /// Training FLOPs per token, torchtitan's MoE formula: 6 * (N_dense - N_embedding + N_router +
  /// N_shared + N_experts * top_k / num_experts) + 12 * L * H * HD * S, active experts only. A tied
  /// embedding counts as the output matmul it also is (torchtitan drops it; see docs/qwen3.md).
  int64_t num_flops_per_token(int64_t seq_len) const;
  /// The plan for this job on mesh (see models/qwen3/parallelize.hpp).
  parallel::ParallelPlan parallel_plan(const JobConfig& config, const dist::Mesh& mesh) const;
  /// Maps this model to and from Hugging Face Qwen3ForCausalLM / Qwen3MoeForCausalLM weights.
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const;

  int64_t vocab_size() const { return args_.vocab_size; }
  const Qwen3Args& args() const { return args_; }
  int64_t seq_len() const { return seq_len_; }
  /// The MoE layers this part holds (for expert-bias updates and load logging).
  std::vector<std::shared_ptr<nn::MoE>> moe_layers() const;

  std::shared_ptr<nn::Embedding> tok_embeddings;          // null in a part without it
  std::vector<std::shared_ptr<TransformerBlock>> layers;  // registered as layers.<layer_id>; a part's only
  std::shared_ptr<nn::RMSNorm> norm;                      // null in a part without it
  std::shared_ptr<nn::Linear> output;                     // null when tie_word_embeddings or not in the part

 private:
  Qwen3Args args_;
  int64_t seq_len_;
  nn::RopeTables rope_;  // cos/sin (S, HD/2), not parameters
};

}  // namespace titan::qwen3

#include "titan/models/trainable_model.hpp"
static_assert(titan::TrainableModel<titan::qwen3::Qwen3>, "Qwen3 must satisfy TrainableModel");
