// SPDX-License-Identifier: BSD-3-Clause
// DeepSeekV3::build: job config -> model (torchtitan's update_from_config: seq_len from training).
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/models/deepseek_v3/model.hpp"

namespace titan::deepseek_v3 {

std::shared_ptr<DeepSeekV3> DeepSeekV3::build(const JobConfig& config, int64_t vocab_size, const at::Device& device,
                                              const std::vector<std::string>& modules) {
  if (config.model.name != "deepseek_v3") {
    throw ConfigError("model.name", fmt::format("[titan::deepseek_v3] expected model.name = 'deepseek_v3', got '{}'. "
                                                "Build this model with model.name = deepseek_v3.",
                                                config.model.name));
  }
  DeepSeekV3Args args = flavor(config.model.flavor);
  if (vocab_size > 0) args.vocab_size = vocab_size;
  return std::make_shared<DeepSeekV3>(args, config.training.seq_len, at::TensorOptions().device(device), modules);
}

}  // namespace titan::deepseek_v3
