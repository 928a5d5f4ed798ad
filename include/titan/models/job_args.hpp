// SPDX-License-Identifier: BSD-3-Clause
// The one adapter from a job config to model arguments: which family, flavor, sequence length and vocabulary a
// job asks for. Models themselves never see the job config; the Trainer, the bundled programs and the tools call
// this, and Trainer<Model>(config) uses JobArgs<Model> when the model type has one.
//
//   auto model = titan::models::build_model(config, 0, {.device = at::kCPU});   // model.name's family
#pragma once

#include <cstdint>
#include <memory>

namespace titan {
struct JobConfig;
struct ModelBuild;
}  // namespace titan
namespace titan::llama3 {
class Llama3;
struct Llama3Args;
}  // namespace titan::llama3
namespace titan::qwen3 {
class Qwen3;
struct Qwen3Args;
}  // namespace titan::qwen3
namespace titan::deepseek_v3 {
class DeepSeekV3;
struct DeepSeekV3Args;
}  // namespace titan::deepseek_v3
namespace titan::gpt_oss {
class GptOss;
struct GptOssArgs;
}  // namespace titan::gpt_oss

namespace titan::models {

class Decoder;
struct DecoderArgs;

/// What a job asks for: model.name, model.flavor, training.seq_len as the longest sequence (torchtitan's
/// update_from_config), model.moe_load_balance_loss_weight; vocab_size > 0 replaces the flavor's.
DecoderArgs decoder_args(const JobConfig& config, int64_t vocab_size = 0);

/// model.name's family built for the job where `where` says: Decoder::build(decoder_args(config, vocab_size), where).
std::shared_ptr<Decoder> build_model(const JobConfig& config, int64_t vocab_size, const ModelBuild& where);

/// Model::Args as a job states them, for Trainer<Model>(config); a model type without one takes its arguments
/// from the caller (Trainer<Model>(config, args)).
template <class Model>
struct JobArgs;

template <>
struct JobArgs<Decoder> {
  static DecoderArgs make(const JobConfig& config);
};
// A family class's arguments: model.name must be the family's, model.flavor gives them.
template <>
struct JobArgs<llama3::Llama3> {
  static llama3::Llama3Args make(const JobConfig& config);
};
template <>
struct JobArgs<qwen3::Qwen3> {
  static qwen3::Qwen3Args make(const JobConfig& config);
};
template <>
struct JobArgs<deepseek_v3::DeepSeekV3> {
  static deepseek_v3::DeepSeekV3Args make(const JobConfig& config);
};
template <>
struct JobArgs<gpt_oss::GptOss> {
  static gpt_oss::GptOssArgs make(const JobConfig& config);
};

}  // namespace titan::models
