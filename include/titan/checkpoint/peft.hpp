// SPDX-License-Identifier: BSD-3-Clause
// LoRA adapters out of titan (nn/lora.hpp): a PEFT adapter folder (adapter_model.safetensors + adapter_config.json)
// that peft's PeftModel.from_pretrained loads onto the Hugging Face model of titan's HF export of the base, and the
// base with the adapters folded in (W + alpha / rank * B A) for a plain HF export. Tensors are whole and keyed by
// titan FQN: X.weight for a base weight, X.lora_a.weight and X.lora_b.weight for its adapter.
//
// PEFT's names are the HF module's with its prefix and LoRA's capitals: layers.0.attention.wq.lora_a.weight ->
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight. A Linear's HF layout permutes its output rows at
// most (Llama's q/k RoPE rows), so B takes the weight's HfAdapter::to_hf and A is written as it is.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace titan::checkpoint {

class HfAdapter;

/// How save_peft writes an adapter.
struct PeftOptions {
  /// The run's LoRA settings as its checkpoint records them (values["lora"]: rank, alpha, dropout).
  nlohmann::json lora = nlohmann::json::object();
  /// dtype of the saved tensors.
  at::ScalarType dtype = at::kFloat;
  /// adapter_config.json's base_model_name_or_path: the HF base folder or hub name ("" = null).
  std::string base_model{};
  /// The run's model.hf_assets_path (a folder, or its tokenizer.json): the adapter folder carries its tokenizer as
  /// save_hf's export does, so AutoTokenizer.from_pretrained reads it beside the adapter ("" = none).
  std::filesystem::path tokenizer{};
};

/// alpha / rank of a checkpoint's values["lora"]; throws naming what is missing.
double lora_scale(const nlohmann::json& lora);

/// The PEFT key of an adapter FQN (X.lora_a.weight or X.lora_b.weight) under `adapter`'s HF names.
std::string peft_name(const std::string& fqn, const HfAdapter& adapter);

/// Writes `adapters` (FQN, whole tensor) as a PEFT LoRA adapter folder for a causal LM: adapter_model.safetensors and
/// adapter_config.json (target_modules: the adapted HF modules by full path). Written under a temporary name and
/// renamed when complete.
void save_peft(const std::filesystem::path& folder, const std::vector<std::pair<std::string, at::Tensor>>& adapters,
               const HfAdapter& adapter, const PeftOptions& options);

/// The adapters of `fqns` (X.lora_a.weight, X.lora_b.weight) read back from a PEFT folder save_peft wrote, whole,
/// in titan's layout; throws naming the folder and key that is missing or of another rank.
std::vector<std::pair<std::string, at::Tensor>> load_peft(const std::filesystem::path& folder,
                                                          const std::vector<std::string>& fqns,
                                                          const HfAdapter& adapter);

/// `base` (FQN, whole tensor) with each adapter folded into its Linear's weight, W + scale * B A (computed in fp32,
/// stored in W's dtype): the model the adapters train, as plain weights. Throws naming an adapter whose weight is not
/// in `base` (an adapter-only checkpoint needs its base).
std::vector<std::pair<std::string, at::Tensor>> merge_lora(
    std::vector<std::pair<std::string, at::Tensor>> base,
    const std::vector<std::pair<std::string, at::Tensor>>& adapters, double scale);

/// The dtype a QLoRA run's checkpoint (values["lora"] with quantize_base) held its NF4 bases in; nullopt for a LoRA
/// run.
std::optional<at::ScalarType> nf4_base_dtype(const nlohmann::json& lora);

/// `base` with the weight of each Linear that has an adapter in `adapters` as a QLoRA run computed with it:
/// quant::dequantize(quant::to_nf4(W in `dtype`)), stored in W's dtype. Merging the adapters into these gives the
/// model they were trained in.
std::vector<std::pair<std::string, at::Tensor>> nf4_bases(
    std::vector<std::pair<std::string, at::Tensor>> base,
    const std::vector<std::pair<std::string, at::Tensor>>& adapters, at::ScalarType dtype);

}  // namespace titan::checkpoint
