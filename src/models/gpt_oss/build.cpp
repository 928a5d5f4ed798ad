// SPDX-License-Identifier: BSD-3-Clause
// GptOss::build: job config -> model (torchtitan's update_from_config: seq_len from training).
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/models/gpt_oss/model.hpp"

namespace titan::gpt_oss {

std::shared_ptr<GptOss> GptOss::build(const JobConfig& config, int64_t vocab_size, const at::Device& device,
                                      const std::vector<std::string>& modules) {
  if (config.model.name != "gpt_oss") {
    throw ConfigError("model.name", fmt::format("[titan::gpt_oss] expected model.name = 'gpt_oss', got '{}'. "
                                                "Build a {} model with its own class.",
                                                config.model.name, config.model.name));
  }
  GptOssArgs args = flavor(config.model.flavor);
  if (vocab_size > 0) args.vocab_size = vocab_size;
  return std::make_shared<GptOss>(args, config.training.seq_len, at::TensorOptions().device(device), modules);
}

}  // namespace titan::gpt_oss
