// SPDX-License-Identifier: BSD-3-Clause
// Llama 3 with torchtitan's exact architecture and parameter names (`tok_embeddings.weight`,
// `layers.N.attention.wq.weight`, ..., `norm.weight`, `output.weight`) and init scheme: the decoder
// skeleton (models/decoder.hpp) with grouped-query attention, a SwiGLU feed-forward and Llama 3.1 RoPE.
// Built on any device: on meta to count or plan a 405B model for free, on a real device to train
// (`init_weights` then fills it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/decoder.hpp"
#include "titan/models/llama3/args.hpp"
#include "titan/parallel/plan.hpp"

namespace titan::checkpoint {
class HfAdapter;
}
namespace titan::llama3 {

class Llama3 : public models::Decoder {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables and must not
  /// exceed args.max_seq_len. With `modules` (top-level paths: "tok_embeddings", "layers.N", "norm",
  /// "output") only those are built: a pipeline rank's part, with the whole model's names.
  Llama3(const Llama3Args& args, int64_t seq_len, const at::TensorOptions& options,
         const std::vector<std::string>& modules = {});

  using Args = Llama3Args;
  /// Builds the model from its arguments (RoPE tables for args.max_seq_len positions) where `where` says.
  static std::shared_ptr<Llama3> build(const Llama3Args& args, const ModelBuild& where = {});

  /// Maps this model to and from Hugging Face LlamaForCausalLM weights (see hf_adapter.hpp).
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const override;

  const Llama3Args& args() const { return args_; }

 private:
  Llama3Args args_;
};

}  // namespace titan::llama3

static_assert(titan::TrainableModel<titan::llama3::Llama3>, "Llama3 must satisfy TrainableModel");
