// SPDX-License-Identifier: BSD-3-Clause
// Llama 3 <-> Hugging Face LlamaForCausalLM: parameter names, config.json, and the q/k row
// permutation (titan, like torchtitan and Meta's weights, rotates adjacent pairs (x[2i], x[2i+1]);
// HF rotates halves (x[i], x[i + hd/2]), so wq/wk rows are reordered within each head).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "titan/checkpoint/hf.hpp"
#include "titan/models/llama3/args.hpp"

namespace titan::llama3 {

/// The adapter for a model with these arguments.
std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const Llama3Args& args);
/// The arguments an HF config.json describes (LlamaConfig keys; rope_scaling or rope_parameters).
Llama3Args args_from_hf_config(const nlohmann::json& config);

}  // namespace titan::llama3
