// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/job_args.hpp"

#include <fmt/format.h>

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/detail/family_args.hpp"
#include "titan/models/gpt_oss/model.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/models/qwen3/model.hpp"

namespace titan::models {
namespace {

// A family class's arguments for a job that names that family.
template <class Args>
Args family_job_args(const JobConfig& config, std::string_view family, Args (*flavor)(std::string_view)) {
  if (config.model.name != family) {
    throw ConfigError("model.name",
                      fmt::format("[titan::{}] expected model.name = '{}', got '{}'. Train a {} model with its own "
                                  "class, or any registered family with models::Decoder.",
                                  family, family, config.model.name, config.model.name));
  }
  return detail::family_args(flavor(config.model.flavor), decoder_args(config), family);
}

}  // namespace

DecoderArgs decoder_args(const JobConfig& config, int64_t vocab_size) {
  return {.family = config.model.name,
          .flavor = config.model.flavor,
          .max_seq_len = config.training.seq_len,
          .vocab_size = vocab_size,
          .moe_load_balance_loss_weight = config.model.moe_load_balance_loss_weight,
          .num_nextn_predict_layers = config.model.num_nextn_predict_layers,
          .mtp_loss_scaling_factor = config.model.mtp_loss_scaling_factor};
}

std::shared_ptr<Decoder> build_model(const JobConfig& config, int64_t vocab_size, const ModelBuild& where) {
  return Decoder::build(decoder_args(config, vocab_size), where);
}

DecoderArgs JobArgs<Decoder>::make(const JobConfig& config) { return decoder_args(config); }

llama3::Llama3Args JobArgs<llama3::Llama3>::make(const JobConfig& config) {
  return family_job_args(config, "llama3", &llama3::flavor);
}
qwen3::Qwen3Args JobArgs<qwen3::Qwen3>::make(const JobConfig& config) {
  return family_job_args(config, "qwen3", &qwen3::flavor);
}
deepseek_v3::DeepSeekV3Args JobArgs<deepseek_v3::DeepSeekV3>::make(const JobConfig& config) {
  return family_job_args(config, "deepseek_v3", &deepseek_v3::flavor);
}
gpt_oss::GptOssArgs JobArgs<gpt_oss::GptOss>::make(const JobConfig& config) {
  return family_job_args(config, "gpt_oss", &gpt_oss::flavor);
}

}  // namespace titan::models
