// SPDX-License-Identifier: BSD-3-Clause
// gpt-oss (OpenAI's open-weight MoE, torchtitan's GptOssModel, HF GptOssForCausalLM) on the decoder
// skeleton, differing from Qwen3-MoE only in its layers' options: attention with q/k/v/o biases, a
// learned sink logit per head and a 128-token sliding window in every even block (nn::Attention's
// bias, sinks, sliding_window); YaRN RoPE (factor 32, untruncated ramp, cos/sin scaled by its mscale);
// an MoE in every block with a biased router gate, biased experts and the clamped SwiGLU (nn::MoEArgs'
// gate_bias, biased_experts, activation). RoPE rotates adjacent pairs (titan's nn::rope) where HF
// rotates halves: wq/wk rows and biases are stored permuted within each head and the HF adapter converts.
//
//   auto model = titan::gpt_oss::GptOss::build(titan::gpt_oss::flavor("debugmodel"), {.device = at::kCPU});
//   model->init_weights();
//   at::Tensor logits = model->forward(tokens);                          // (B, S) -> (B, S, V)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/decoder.hpp"
#include "titan/models/gpt_oss/args.hpp"
#include "titan/parallel/plan.hpp"

namespace titan::checkpoint {
class HfAdapter;
}

namespace titan::gpt_oss {

/// The decoder shape of these args (models/decoder_shape.hpp): every block MoE; no pipeline or context
/// parallelism (the sinks and the window are not built into the context-parallel attention).
models::DecoderShape decoder_shape(const GptOssArgs& args);

class GptOss : public models::Decoder {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables and must not
  /// exceed args.max_seq_len. With `modules` (top-level paths) only those are built.
  GptOss(const GptOssArgs& args, int64_t seq_len, const at::TensorOptions& options,
         const std::vector<std::string>& modules = {});

  using Args = GptOssArgs;
  /// Builds the model from its arguments (RoPE tables for args.max_seq_len positions) where `where` says.
  static std::shared_ptr<GptOss> build(const GptOssArgs& args, const ModelBuild& where = {});

  /// The decoder's spec, refusing what gpt-oss's layers lack with their reasons: context parallelism (sinks,
  /// window), tensor parallelism (biases, sinks) and pipeline parallelism (not tested).
  parallel::ShardingSpec sharding_spec() const override;
  /// Maps this model to and from Hugging Face GptOssForCausalLM weights.
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const override;

  const GptOssArgs& args() const { return args_; }

 private:
  GptOssArgs args_;
};

}  // namespace titan::gpt_oss
