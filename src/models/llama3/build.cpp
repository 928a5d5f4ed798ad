// SPDX-License-Identifier: BSD-3-Clause
// Llama3::build: job config -> model (torchtitan's update_from_config: seq_len from training).
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"

#include "titan/core/error.hpp"

namespace titan::llama3 {

std::shared_ptr<Llama3> Llama3::build(const JobConfig& config, int64_t vocab_size, const at::Device& device,
                                      const std::vector<std::string>& modules) {
  if (config.model.name != "llama3") {
    throw ConfigError("model.name", fmt::format("[titan::llama3] expected model.name = 'llama3', got '{}'. "
                                                "This build knows the llama3 model.",
                                                config.model.name));
  }
  Llama3Args args = flavor(config.model.flavor);
  if (vocab_size > 0) args.vocab_size = vocab_size;
  return std::make_shared<Llama3>(args, config.training.seq_len, at::TensorOptions().device(device), modules);
}

}  // namespace titan::llama3
