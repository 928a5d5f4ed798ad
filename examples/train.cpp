// SPDX-License-Identifier: BSD-3-Clause
// Train any registered model with titan's Trainer, the model picked by --model.name from the registry
// (models/model_spec.hpp):
//   build/bin/train --model.name qwen3 --model.flavor debugmodel --training.steps 10
//   build/bin/train --job.config_file configs/qwen3_debugmodel_cpu.toml
//   build/bin/train --model.name deepseek_v3 --model.flavor debugmodel --training.seq_len 256
// llama3 (the default), qwen3, deepseek_v3 and gpt_oss are bundled; train_llama3 is the same for Llama 3 alone.
// --help lists every key.
#include <titan/titan.hpp>

#include <exception>

int main(int argc, char** argv) {
  try {
    titan::ConfigNotes notes;
    titan::JobConfig config = titan::parse_args(argc, argv, &notes);
    if (notes.help_requested) {
      fmt::print("{}", titan::config_help());
      return 0;
    }
    for (const auto& note : notes) titan::log::warn("{}", note);
    titan::Trainer<titan::models::Decoder> trainer(std::move(config));
    trainer.train();
    return 0;
  } catch (const std::exception& e) {
    titan::log::error("{}", titan::error_message(e));
    return 1;
  }
}
