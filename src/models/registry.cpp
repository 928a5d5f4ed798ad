// SPDX-License-Identifier: BSD-3-Clause
// The model registry, holding the bundled families from its first use (listed here rather than registered
// by static initialisers, which a static library's linker may drop).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "titan/core/error.hpp"
#include "titan/models/deepseek_v3/hf_adapter.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/detail/family_args.hpp"
#include "titan/models/gpt_oss/hf_adapter.hpp"
#include "titan/models/gpt_oss/model.hpp"
#include "titan/models/llama3/hf_adapter.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/models/qwen3/hf_adapter.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/models/qwen3_5/hf_adapter.hpp"
#include "titan/models/qwen3_5/model.hpp"

namespace titan::models {
namespace {

// The spec of a family whose class has Model::build(args, where), its flavors' arguments and a constructor
// (Args, seq_len, options).
template <class Model, class ArgsFromHf>
ModelSpec bundled(std::string name, std::vector<std::string> architectures, std::vector<std::string> (*flavors)(),
                  typename Model::Args (*flavor)(std::string_view), ArgsFromHf args_from_hf) {
  return {.name = name,
          .hf_architectures = std::move(architectures),
          .flavors = flavors,
          .build = [name, flavor](const DecoderArgs& args, const ModelBuild& where) -> std::shared_ptr<Decoder> {
            return Model::build(detail::family_args(flavor(args.flavor), args, name), where);
          },
          .from_hf = [args_from_hf](const nlohmann::json& hf, int64_t seq_len,
                                    const at::Device& device) -> std::shared_ptr<Decoder> {
            return std::make_shared<Model>(args_from_hf(hf), seq_len, at::TensorOptions().device(device));
          }};
}

ModelSpec with_attention_memory(ModelSpec spec, AttentionMemoryModel model) {
  spec.attention_memory = std::move(model);
  return spec;
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, ModelSpec, std::less<>> specs;

  Registry() {
    for (ModelSpec spec :
         {bundled<llama3::Llama3>("llama3", {"LlamaForCausalLM"}, llama3::flavor_names, llama3::flavor,
                                  llama3::args_from_hf_config),
          bundled<qwen3::Qwen3>("qwen3", {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}, qwen3::flavor_names,
                                qwen3::flavor, qwen3::args_from_hf_config),
          with_attention_memory(
              bundled<deepseek_v3::DeepSeekV3>("deepseek_v3", {"DeepseekV3ForCausalLM"}, deepseek_v3::flavor_names,
                                               deepseek_v3::flavor, deepseek_v3::args_from_hf_config),
              deepseek_v3::attention_memory),
          bundled<gpt_oss::GptOss>("gpt_oss", {"GptOssForCausalLM"}, gpt_oss::flavor_names, gpt_oss::flavor,
                                   gpt_oss::args_from_hf_config),
          with_attention_memory(bundled<qwen3_5::Qwen35>("qwen3_5", {"Qwen3_5ForCausalLM"}, qwen3_5::flavor_names,
                                                         qwen3_5::flavor, qwen3_5::args_from_hf_config),
                                qwen3_5::attention_memory),
          with_attention_memory(
              bundled<qwen3_5::Qwen35>("qwen3_5_moe", {"Qwen3_5MoeForCausalLM"}, qwen3_5::moe_flavor_names,
                                       qwen3_5::moe_flavor, qwen3_5::args_from_hf_config),
              qwen3_5::attention_memory)}) {
      specs.emplace(spec.name, std::move(spec));
    }
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_model(ModelSpec spec) {
  TITAN_CHECK_VALUE(!spec.name.empty() && spec.build,
                    "[titan::models::register_model] expected a spec with a name and a build function, got name '{}' "
                    "and {} build. Fill ModelSpec::name and ModelSpec::build.",
                    spec.name, spec.build ? "a" : "no");
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.specs.insert_or_assign(spec.name, std::move(spec));
}

const ModelSpec& model_spec(std::string_view name) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.specs.find(name);
  if (it == r.specs.end()) {
    std::vector<std::string> known;
    for (const auto& entry : r.specs) known.push_back(entry.first);
    throw ConfigError("model.name", fmt::format("[titan::models] expected model.name to be one of {}, got '{}'. Pick "
                                                "a registered model, or register yours with "
                                                "titan::models::register_model.",
                                                known, name));
  }
  return it->second;  // entries are never erased, so the reference outlives the lock
}

const ModelSpec& model_spec_for_hf(const nlohmann::json& hf_config) {
  const auto archs = hf_config.find("architectures");
  const std::string arch = archs != hf_config.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string()
                               ? (*archs)[0].get<std::string>()
                               : std::string();
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::vector<std::string> known;
  for (const auto& [name, spec] : r.specs) {
    for (const auto& a : spec.hf_architectures) {
      if (a == arch && spec.from_hf) return spec;
      known.push_back(a);
    }
  }
  throw ConfigError("config.json", fmt::format("[titan::models] expected a Hugging Face config.json whose "
                                               "architectures[0] is one of {}, got '{}'. Convert a model of a "
                                               "registered family.",
                                               known, arch));
}

std::vector<std::string> model_names() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& entry : r.specs) names.push_back(entry.first);
  return names;
}

}  // namespace titan::models
