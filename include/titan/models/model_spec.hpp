// SPDX-License-Identifier: BSD-3-Clause
// Model specs: one registry entry per model family, which every tool looks up by name (the trainer's
// `Trainer<models::Decoder>`, the bundled `train`, titan-generate, titan-convert, titan-plan) or by a Hugging Face
// config's `architectures` (titan-convert, titan-generate --hf). No tool names a family. The bundled families
// (llama3, qwen3, deepseek_v3, gpt_oss) are registered on first use; a user adds theirs once at start-up:
//
//   titan::models::register_model({.name = "mymodel",
//                                  .flavors = [] { return std::vector<std::string>{"debugmodel"}; },
//                                  .build = [](const models::DecoderArgs& a, const ModelBuild& where) { ... }});
//   titan::Trainer<titan::models::Decoder> trainer(config);  // config.model.name = "mymodel"
//
// models/job_args.hpp turns a job config into a family's arguments.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "titan/models/memory_model.hpp"

namespace titan {
struct ModelBuild;
}

namespace titan::models {

class Decoder;
struct DecoderArgs;

/// A model family as the tools see it.
struct ModelSpec {
  /// Its model.name ("llama3").
  std::string name{};
  /// The Hugging Face `architectures` entries it imports ("LlamaForCausalLM").
  std::vector<std::string> hf_architectures{};
  /// Its model.flavor names, sorted.
  std::function<std::vector<std::string>()> flavors{};
  /// Builds a model of the family (args.flavor's arguments with args' replacements) where `where` says (meta:
  /// shapes only; a module list: a pipeline part).
  std::function<std::shared_ptr<Decoder>(const DecoderArgs& args, const ModelBuild& where)> build{};
  /// Builds the architecture a Hugging Face config.json describes, for seq_len positions; null: no HF import.
  std::function<std::shared_ptr<Decoder>(const nlohmann::json& hf_config, int64_t seq_len, const at::Device& device)>
      from_hf{};
  /// What one block's attention keeps for backward, for the memory planner (planner/memory_plan.hpp); null:
  /// nn::Attention's (models::nn_attention_memory). Everything else of a block the planner counts itself.
  AttentionMemoryModel attention_memory{};
};

/// Adds a family (replacing one of the same name). Thread-safe.
void register_model(ModelSpec spec);
/// The family named `name`; throws ConfigError on model.name listing the registered names.
const ModelSpec& model_spec(std::string_view name);
/// The family whose hf_architectures holds the config's first `architectures` entry; throws naming it and
/// the known architectures.
const ModelSpec& model_spec_for_hf(const nlohmann::json& hf_config);
/// The registered names, sorted.
std::vector<std::string> model_names();

}  // namespace titan::models
