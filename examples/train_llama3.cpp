// SPDX-License-Identifier: BSD-3-Clause
// Train Llama 3 with titan's Trainer. On a fresh machine (see README):
//   scripts/setup.sh && build/bin/train_llama3 --job.config_file configs/llama3_debugmodel_cpu.toml
// Any torchtitan v0.2 key can be overridden: --training.steps 50 --optimizer.lr=3e-4; --help lists all.
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
    titan::Trainer<titan::llama3::Llama3> trainer(std::move(config));
    trainer.train();
    return 0;
  } catch (const std::exception& e) {
    titan::log::error("{}", titan::error_message(e));
    return 1;
  }
}
