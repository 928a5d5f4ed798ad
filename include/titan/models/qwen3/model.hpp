// SPDX-License-Identifier: BSD-3-Clause
// Qwen3 and Qwen3-MoE with torchtitan's architecture, parameter names (`tok_embeddings.weight`,
// `layers.N.attention.{wq,wk,wv,wo,q_norm,k_norm}.weight`, `layers.N.feed_forward.w1.weight` or
// `layers.N.moe.{router.gate.weight,experts.w1,...}`, `norm.weight`, `output.weight`) and init
// scheme, built from titan's layers: nn::Attention with head_dim and q/k norm, nn::FeedForward,
// nn::MoE. One difference from torchtitan's Qwen3: RoPE rotates adjacent pairs (titan's nn::rope)
// where torchtitan and HF rotate halves, so wq/wk rows and the q/k norm weights are stored permuted
// within each head; the HF adapter converts (the model computes the same function).
//
//   auto model = titan::qwen3::Qwen3::build(titan::qwen3::flavor("0.6B"), {.device = at::kCPU});
//   model->init_weights();
//   at::Tensor logits = model->forward(tokens);                     // (B, S) -> (B, S, V)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/decoder.hpp"
#include "titan/models/qwen3/args.hpp"
#include "titan/parallel/plan.hpp"

namespace titan::checkpoint {
class HfAdapter;
}

namespace titan::qwen3 {

/// The decoder shape of these args (models/decoder_shape.hpp): blocks, heads, MoE layers.
models::DecoderShape decoder_shape(const Qwen3Args& args);

class Qwen3 : public models::Decoder {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables and must not
  /// exceed args.max_seq_len. With `modules` (top-level paths: "tok_embeddings", "layers.N", "norm",
  /// "output") only those are built: a pipeline rank's part, with the whole model's names.
  Qwen3(const Qwen3Args& args, int64_t seq_len, const at::TensorOptions& options,
        const std::vector<std::string>& modules = {});

  using Args = Qwen3Args;
  /// Builds the model from its arguments (RoPE tables for args.max_seq_len positions) where `where` says.
  static std::shared_ptr<Qwen3> build(const Qwen3Args& args, const ModelBuild& where = {});

  /// Maps this model to and from Hugging Face Qwen3ForCausalLM / Qwen3MoeForCausalLM weights.
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const override;

  const Qwen3Args& args() const { return args_; }

 private:
  Qwen3Args args_;
};

}  // namespace titan::qwen3

static_assert(titan::TrainableModel<titan::qwen3::Qwen3>, "Qwen3 must satisfy TrainableModel");
