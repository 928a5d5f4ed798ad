// SPDX-License-Identifier: BSD-3-Clause
#include "titan/checkpoint/peft.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "titan/checkpoint/hf.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/error.hpp"
#include "titan/quant/nf4.hpp"

namespace titan::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kWeight = ".weight";
constexpr std::pair<std::string_view, std::string_view> kSuffixes[] = {{".lora_a.weight", ".lora_A.weight"},
                                                                       {".lora_b.weight", ".lora_B.weight"}};

// An adapter FQN split: its Linear's weight FQN, and whether it is B.
struct AdapterName {
  std::string weight;
  bool b = false;
};

AdapterName split_adapter(const std::string& fqn) {
  for (const auto& [suffix, _] : kSuffixes) {
    if (fqn.ends_with(suffix)) {
      return {.weight = fqn.substr(0, fqn.size() - suffix.size()) + std::string(kWeight),
              .b = suffix == kSuffixes[1].first};
    }
  }
  TITAN_CHECK_VALUE(false,
                    "[titan::checkpoint::peft] expected a LoRA adapter name (X.lora_a.weight or X.lora_b.weight), "
                    "got '{}'.",
                    fqn);
  return {};
}

// The HF module path of a Linear whose weight is `weight` (model.layers.0.self_attn.q_proj).
std::string hf_module(const std::string& weight, const HfAdapter& adapter) {
  const std::string hf = adapter.hf_name(weight);
  TITAN_CHECK_VALUE(hf.ends_with(kWeight),
                    "[titan::checkpoint::peft] expected the Hugging Face name of '{}' to end in .weight (a Linear's), "
                    "got '{}'. PEFT adapts Linear modules only.",
                    weight, hf);
  return hf.substr(0, hf.size() - kWeight.size());
}

}  // namespace

double lora_scale(const nlohmann::json& lora) {
  TITAN_CHECK_VALUE(lora.is_object() && lora.contains("rank") && lora.contains("alpha"),
                    "[titan::checkpoint::peft] expected the checkpoint's LoRA settings (values \"lora\" with rank and "
                    "alpha), got {}. Use a checkpoint of a run with model.converters lora.",
                    lora.dump());
  return lora.at("alpha").get<double>() / static_cast<double>(lora.at("rank").get<int64_t>());
}

std::string peft_name(const std::string& fqn, const HfAdapter& adapter) {
  const AdapterName name = split_adapter(fqn);
  return "base_model.model." + hf_module(name.weight, adapter) + std::string(kSuffixes[name.b ? 1 : 0].second);
}

void save_peft(const fs::path& folder, const std::vector<std::pair<std::string, at::Tensor>>& adapters,
               const HfAdapter& adapter, const PeftOptions& options) {
  (void)lora_scale(options.lora);  // the settings are complete before anything is written
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> modules;
  for (const auto& [fqn, t] : adapters) {
    const AdapterName name = split_adapter(fqn);
    const at::Tensor cpu = t.detach().to(at::kCPU);  // A (rank, in) or B (out, rank)
    // B's rows are the Linear's output features: they move as the weight's rows do.
    tensors.emplace_back(peft_name(fqn, adapter), (name.b ? adapter.to_hf(name.weight, cpu) : cpu).to(options.dtype));
    modules.insert(hf_module(name.weight, adapter));
  }
  nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", options.base_model.empty() ? nlohmann::json() : nlohmann::json(options.base_model)},
      {"r", options.lora.at("rank")},
      {"lora_alpha", options.lora.at("alpha")},
      {"lora_dropout", options.lora.value("dropout", 0.0)},
      {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
  };
  write_folder_atomically(folder, [&](const fs::path& tmp) {
    write_safetensors(tmp / "adapter_model.safetensors", tensors, {{"format", "pt"}});
    write_file_atomically(tmp / "adapter_config.json", config.dump(2));
    if (!options.tokenizer.empty()) write_tokenizer_files(options.tokenizer, tmp, folder);
  });
}

std::vector<std::pair<std::string, at::Tensor>> load_peft(const fs::path& folder, const std::vector<std::string>& fqns,
                                                          const HfAdapter& adapter) {
  const fs::path file = folder / "adapter_model.safetensors";
  TITAN_CHECK_VALUE(fs::exists(file),
                    "[titan::checkpoint::load_peft] expected a PEFT adapter folder with {}, got none.", file.string());
  const SafetensorsFile peft(file);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const std::string& fqn : fqns) {
    const std::string key = peft_name(fqn, adapter);
    TITAN_CHECK_VALUE(peft.contains(key),
                      "[titan::checkpoint::load_peft] expected '{}' (the adapter {}) in '{}', got none. The adapter "
                      "targets other modules or another model.",
                      key, fqn, file.string());
    const AdapterName name = split_adapter(fqn);
    const at::Tensor t = peft.read(key);
    out.emplace_back(fqn, name.b ? adapter.from_hf(name.weight, t) : t);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> merge_lora(
    std::vector<std::pair<std::string, at::Tensor>> base,
    const std::vector<std::pair<std::string, at::Tensor>>& adapters, double scale) {
  std::map<std::string, at::Tensor> a_of, b_of;  // by the Linear's weight FQN
  for (const auto& [fqn, t] : adapters) {
    const AdapterName name = split_adapter(fqn);
    (name.b ? b_of : a_of)[name.weight] = t;
  }
  for (const auto& [weight, a] : a_of) {
    const auto it = std::find_if(base.begin(), base.end(), [&](const auto& named) { return named.first == weight; });
    TITAN_CHECK_VALUE(it != base.end() && b_of.contains(weight),
                      "[titan::checkpoint::merge_lora] expected the base weight '{}' and both adapters of its Linear, "
                      "got {}. An adapter-only checkpoint merges with its base (titan-convert to-hf --base).",
                      weight, it == base.end() ? "no base weight" : "lora_a without lora_b");
    const at::Tensor w = it->second;                                                        // (out, in)
    const at::Tensor delta = at::matmul(b_of.at(weight).to(at::kFloat), a.to(at::kFloat));  // (out, in)
    it->second = (w.to(at::kFloat) + delta * scale).to(w.scalar_type());
  }
  return base;
}

std::optional<at::ScalarType> nf4_base_dtype(const nlohmann::json& lora) {
  if (!lora.is_object() || !lora.value("quantize_base", false)) return std::nullopt;
  const std::string dtype = lora.value("nf4_dtype", std::string());
  TITAN_CHECK_VALUE(dtype == "float32" || dtype == "bfloat16",
                    "[titan::checkpoint::nf4_base_dtype] expected values[\"lora\"][\"nf4_dtype\"] float32 or bfloat16 "
                    "in a QLoRA checkpoint, got '{}'. Pass a checkpoint a QLoRA run wrote.",
                    dtype);
  return dtype == "float32" ? at::kFloat : at::kBFloat16;
}

std::vector<std::pair<std::string, at::Tensor>> nf4_bases(
    std::vector<std::pair<std::string, at::Tensor>> base,
    const std::vector<std::pair<std::string, at::Tensor>>& adapters, at::ScalarType dtype) {
  std::set<std::string> adapted;
  for (const auto& [fqn, _] : adapters) adapted.insert(split_adapter(fqn).weight);
  for (auto& [fqn, w] : base) {
    if (!adapted.contains(fqn)) continue;
    w = quant::dequantize(quant::to_nf4(w.to(dtype).contiguous())).to(w.scalar_type());  // (out, in)
  }
  return base;
}

}  // namespace titan::checkpoint
