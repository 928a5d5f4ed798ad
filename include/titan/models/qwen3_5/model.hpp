// SPDX-License-Identifier: BSD-3-Clause
// Qwen3.5 and Qwen3.5-MoE (HF's Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM, the text model of the Qwen3.5 release)
// on the decoder skeleton. What differs from Qwen3 is its blocks' options: three of every four blocks mix tokens
// through Gated DeltaNet linear attention (nn::GatedDeltaNet), the fourth through softmax attention with an output
// gate and RoPE on a quarter of each head (nn::Attention's output_gate and rotary_dim); every norm scales by
// 1 + weight; Qwen3.5-MoE's feed-forward is an nn::MoE with a gated shared expert. RoPE rotates adjacent pairs
// (titan's nn::rope) where HF rotates halves: the rotated rows of wq/wk and the q/k norm weights are stored permuted
// and the HF adapter converts.
//
//   auto model = titan::qwen3_5::Qwen35::build(titan::qwen3_5::flavor("debugmodel"), {.device = at::kCPU});
//   model->init_weights();
//   at::Tensor logits = model->forward(tokens);   // (B, S) -> (B, S, V)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/models/decoder.hpp"
#include "titan/models/memory_model.hpp"
#include "titan/models/qwen3_5/args.hpp"

namespace titan::checkpoint {
class HfAdapter;
}

namespace titan::qwen3_5 {

/// The decoder shape of these args (models/decoder_shape.hpp): the linear-attention blocks, the MoE blocks, no
/// pipeline parallelism (its sharding spec allows context parallelism over contiguous shards).
models::DecoderShape decoder_shape(const Qwen35Args& args);

class Qwen35 : public models::Decoder {
 public:
  /// Builds the model with uninitialised parameters; `seq_len` sizes the RoPE tables and must not exceed
  /// args.max_seq_len. With `modules` (top-level paths) only those are built.
  Qwen35(const Qwen35Args& args, int64_t seq_len, const at::TensorOptions& options,
         const std::vector<std::string>& modules = {});

  using Args = Qwen35Args;
  /// Builds the model from its arguments (RoPE tables for args.max_seq_len positions) where `where` says.
  static std::shared_ptr<Qwen35> build(const Qwen35Args& args, const ModelBuild& where = {});

  /// The decoder's spec with a Gated DeltaNet block's tensor-parallel roles (its heads split: projections,
  /// convolution channels, decay rates), refusing with the reason what is not built: load-balanced context parallelism
  /// (the recurrence passes its state from each cp rank to the next, so each holds a contiguous part), pipeline and
  /// expert parallelism (not tested).
  parallel::ShardingSpec sharding_spec() const override;
  /// Maps this model to and from Hugging Face Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM weights.
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const override;

  const Qwen35Args& args() const { return args_; }

 private:
  Qwen35Args args_;
};

/// What one block's attention keeps for backward on one rank for one microbatch (no document masks), for the memory
/// planner (its ModelSpec::attention_memory): a Gated DeltaNet block's tensors, the chunked delta rule's state entering
/// each chunk among them and under context parallelism the carry received from the previous cp rank; a full-attention
/// block's nn::Attention terms plus its output gate.
models::AttentionMemory attention_memory(const nn::AttentionLayer& layer, const models::ActivationShapes& x);

}  // namespace titan::qwen3_5

static_assert(titan::TrainableModel<titan::qwen3_5::Qwen35>, "Qwen35 must satisfy TrainableModel");
