// SPDX-License-Identifier: BSD-3-Clause
// Train any bundled model with titan's Trainer, the model picked by --model.name:
//   build/bin/train --model.name qwen3 --model.flavor debugmodel --training.steps 10
//   build/bin/train --job.config_file configs/qwen3_debugmodel_cpu.toml
//   build/bin/train --model.name deepseek_v3 --model.flavor debugmodel --training.seq_len 256
// llama3 (the default), qwen3 and deepseek_v3; train_llama3 is the same for Llama 3 alone. --help lists
// every key.
#include <titan/models/deepseek_v3/model.hpp>
#include <titan/models/qwen3/model.hpp>
#include <titan/titan.hpp>

#include <exception>

namespace {

template <class Model>
void train(titan::JobConfig config) {
  titan::Trainer<Model> trainer(std::move(config));
  trainer.train();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    titan::ConfigNotes notes;
    titan::JobConfig config = titan::parse_args(argc, argv, &notes);
    if (notes.help_requested) {
      fmt::print("{}", titan::config_help());
      return 0;
    }
    for (const auto& note : notes) titan::log::warn("{}", note);
    if (config.model.name == "qwen3") {
      train<titan::qwen3::Qwen3>(std::move(config));
    } else if (config.model.name == "deepseek_v3") {
      train<titan::deepseek_v3::DeepSeekV3>(std::move(config));
    } else if (config.model.name == "llama3") {
      train<titan::llama3::Llama3>(std::move(config));
    } else {
      throw titan::ConfigError("model.name",
                               fmt::format("[train] expected model.name llama3, qwen3 or deepseek_v3, got '{}'. "
                                           "Pick a bundled model (or write a driver for yours).",
                                           config.model.name));
    }
    return 0;
  } catch (const std::exception& e) {
    titan::log::error("{}", titan::error_message(e));
    return 1;
  }
}
