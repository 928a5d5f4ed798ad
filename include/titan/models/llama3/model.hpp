// SPDX-License-Identifier: BSD-3-Clause
// Llama 3 with torchtitan's exact architecture and parameter names (`tok_embeddings.weight`,
// `layers.N.attention.wq.weight`, ..., `norm.weight`, `output.weight`) and init scheme. Built on
// any device: on meta to count or plan a 405B model for free, on a real device to train
// (`init_weights` then fills it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/llama3/args.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/layers.hpp"
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
namespace titan::nn {
class KVCache;
}

namespace titan::llama3 {

class TransformerBlock : public torch::nn::Module {
 public:
  /// Init-generator streams one block's init_weights takes (a part skips them for absent blocks).
  static constexpr int64_t kInitStreams = 7;
  TransformerBlock(int64_t layer_id, const Llama3Args& args, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const nn::RopeTables& rope) const;  // (B, S, D) -> (B, S, D)
  void init_weights();

  int64_t layer_id;
  double init_std;  // std of this block's output projections (wo, w2, w3)
  std::shared_ptr<nn::RMSNorm> attention_norm;
  std::shared_ptr<nn::Attention> attention;
  std::shared_ptr<nn::RMSNorm> ffn_norm;
  std::shared_ptr<nn::FeedForward> feed_forward;
};

class Llama3 : public torch::nn::Module {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables and must not
  /// exceed args.max_seq_len. With `modules` (top-level paths: "tok_embeddings", "layers.N", "norm",
  /// "output") only those are built: a pipeline rank's part, with the whole model's names.
  Llama3(const Llama3Args& args, int64_t seq_len, const at::TensorOptions& options,
         const std::vector<std::string>& modules = {});

  /// Builds from the job config (model.flavor, training.seq_len) on `device` (default meta);
  /// `vocab_size` > 0 overrides the flavor's; `modules` as in the constructor.
  static std::shared_ptr<Llama3> build(const JobConfig& config, int64_t vocab_size = 0,
                                       const at::Device& device = at::kMeta,
                                       const std::vector<std::string>& modules = {});

  /// tokens (B, S) int64 -> logits (B, S, V) in the parameter dtype.
  at::Tensor forward(const at::Tensor& tokens) const;
  /// Inference with a KV cache (nn/kv_cache.hpp): tokens (B, S) are the next S columns of `cache`
  /// (the left-padded prompts, then one token per step); returns their logits (B, S, V), replicated
  /// under tensor parallelism without loss parallel. No autograd; forward() is not involved.
  at::Tensor forward_cached(const at::Tensor& tokens, nn::KVCache& cache) const;
  /// Runs `modules` in order on x: tokens (B, S) before "tok_embeddings", hidden states (B, S, D)
  /// after it; "output" returns the logits (B, S, V). One pipeline stage's forward.
  at::Tensor forward_part(const at::Tensor& x, const std::vector<std::string>& modules) const;
  /// torchtitan's init scheme (under the current RNG state). A part fills exactly the values its
  /// modules have in the whole model.
  void init_weights();
  /// Parameters without duplicates (tied weights once), in registration order.
  std::vector<at::Tensor> unique_parameters() const;
  /// Number of parameters (tied weights counted once).
  int64_t num_params() const;
  /// torchtitan's training FLOPs per token: 6 * (N - N_embedding) + 12 * L * D * S.
  int64_t num_flops_per_token(int64_t seq_len) const;
  /// torchtitan's plan for this job on mesh (see models/llama3/parallelize.hpp).
  parallel::ParallelPlan parallel_plan(const JobConfig& config, const dist::Mesh& mesh) const;

  /// Maps this model to and from Hugging Face LlamaForCausalLM weights (see hf_adapter.hpp).
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const;

  int64_t vocab_size() const { return args_.vocab_size; }
  const Llama3Args& args() const { return args_; }
  int64_t seq_len() const { return seq_len_; }

  std::shared_ptr<nn::Embedding> tok_embeddings;          // null in a part without it
  std::vector<std::shared_ptr<TransformerBlock>> layers;  // registered as layers.<layer_id>; a part's only
  std::shared_ptr<nn::RMSNorm> norm;                      // null in a part without it
  std::shared_ptr<nn::Linear> output;                     // null when tie_word_embeddings or not in the part

 private:
  Llama3Args args_;
  int64_t seq_len_;
  nn::RopeTables rope_;  // cos/sin (S, HD/2), not parameters
};

}  // namespace titan::llama3

#include "titan/models/trainable_model.hpp"
static_assert(titan::TrainableModel<titan::llama3::Llama3>, "Llama3 must satisfy TrainableModel");
