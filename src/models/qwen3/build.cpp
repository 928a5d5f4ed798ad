// SPDX-License-Identifier: BSD-3-Clause
// Qwen3::build: job config -> model (torchtitan's update_from_config: seq_len from training).
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/models/qwen3/model.hpp"

namespace titan::qwen3 {

std::shared_ptr<Qwen3> Qwen3::build(const JobConfig& config, int64_t vocab_size, const at::Device& device,
                                    const std::vector<std::string>& modules) {
  if (config.model.name != "qwen3") {
    throw ConfigError("model.name", fmt::format("[titan::qwen3] expected model.name = 'qwen3', got '{}'. "
                                                "Build a {} model with its own class.",
                                                config.model.name, config.model.name));
  }
  Qwen3Args args = flavor(config.model.flavor);
  if (vocab_size > 0) args.vocab_size = vocab_size;
  return std::make_shared<Qwen3>(args, config.training.seq_len, at::TensorOptions().device(device), modules);
}

}  // namespace titan::qwen3
