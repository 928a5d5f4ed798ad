// SPDX-License-Identifier: BSD-3-Clause
// gpt-oss (OpenAI's open-weight MoE, torchtitan's GptOssModel, HF GptOssForCausalLM) on the decoder
// skeleton, differing from Qwen3-MoE only in its layers' options: attention with q/k/v/o biases, a
// learned sink logit per head and a 128-token sliding window in every even block (nn::Attention's
// bias, sinks, sliding_window); YaRN RoPE (factor 32, untruncated ramp, cos/sin scaled by its mscale);
// an MoE in every block with a biased router gate, biased experts and the clamped SwiGLU (nn::MoEArgs'
// gate_bias, biased_experts, activation). RoPE rotates adjacent pairs (titan's nn::rope) where HF
// rotates halves: wq/wk rows and biases are stored permuted within each head and the HF adapter converts.
//
//   auto model = titan::gpt_oss::GptOss::build(config, 0, at::kCPU);  // model.name "gpt_oss"
//   model->init_weights();
//   at::Tensor logits = model->forward(tokens);                          // (B, S) -> (B, S, V)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/decoder.hpp"
#include "titan/models/gpt_oss/args.hpp"
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

  /// Builds from the job config (model.name "gpt_oss", model.flavor, training.seq_len) on `device`
  /// (default meta); `vocab_size` > 0 overrides the flavor's; `modules` as in the constructor.
  static std::shared_ptr<GptOss> build(const JobConfig& config, int64_t vocab_size = 0,
                                       const at::Device& device = at::kMeta,
                                       const std::vector<std::string>& modules = {});

  /// models::decoder_parallel_plan (FSDP/HSDP/DDP, expert parallelism, activation checkpointing) after
  /// refusing what gpt-oss's layers lack: context parallelism (sinks, window) and tensor parallelism (biases).
  parallel::ParallelPlan parallel_plan(const JobConfig& config, const dist::Mesh& mesh) const override;
  /// Maps this model to and from Hugging Face GptOssForCausalLM weights.
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const override;

  const GptOssArgs& args() const { return args_; }

 private:
  GptOssArgs args_;
};

}  // namespace titan::gpt_oss
