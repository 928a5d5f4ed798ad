// SPDX-License-Identifier: BSD-3-Clause
// What titan reads but does not act on yet, in one place. A row fires only when its switch is set to a
// non-default value, so torchtitan's TOML files load quietly until they ask for a missing feature.
// When a feature lands, delete its row (and its section from kRecognisedSections).
#include "config_detail.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace titan {
namespace config_detail {
namespace {

constexpr std::string_view kNeedsDistributed = "is not supported yet (titan has FSDP/HSDP/DDP so far); the trainer stops";

struct Unsupported {
  std::string_view key;
  std::function<bool(const json&)> fires;  // given the key's effective value
  std::string_view why;
};

bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_set(const json& v) { return !v.is_null(); }
bool is_non_empty(const json& v) { return !v.empty(); }
bool above_one(const json& v) { return v.is_number_integer() && v.get<int64_t>() > 1; }
auto none_of(std::vector<std::string> allowed) {
  return [allowed = std::move(allowed)](const json& v) {
    return std::find(allowed.begin(), allowed.end(), v.get<std::string>()) == allowed.end();
  };
}

const std::vector<Unsupported>& unsupported_table() {
  static const std::vector<Unsupported> rows = {
      {"profiling.enable_profiling", is_true, "profiling is not supported yet: ignored"},
      {"profiling.enable_memory_snapshot", is_true, "memory snapshots are not supported yet: ignored"},
      {"metrics.enable_tensorboard", is_true, "TensorBoard logging is not available yet: ignored"},
      {"metrics.enable_wandb", is_true, "Weights & Biases has no C++ client: ignored"},
      {"model.converters", is_non_empty, "model converters (float8, mx) are not supported yet: ignored"},
      {"training.enable_cpu_offload", is_true, "CPU offload needs FSDP, not yet available: ignored"},
      {"parallelism.tensor_parallel_degree", above_one, kNeedsDistributed},
      {"parallelism.pipeline_parallel_degree", above_one, kNeedsDistributed},
      {"parallelism.context_parallel_degree", above_one, kNeedsDistributed},
      {"parallelism.expert_parallel_degree", above_one, kNeedsDistributed},
      {"parallelism.expert_tensor_parallel_degree", above_one, kNeedsDistributed},
      {"parallelism.enable_async_tensor_parallel", is_true, "async TP is not supported yet: ignored"},
      {"checkpoint.initial_load_in_hf_quantized", is_true, "quantized HF checkpoints are not supported yet: ignored"},
      {"activation_checkpoint.mode", none_of({"none", "selective"}), "only none and selective so far, not yet: ignored"},
      {"compile.enable", is_true, "titan has no graph compiler yet: ignored"},
      {"float8.enable_fsdp_float8_all_gather", is_true, "float8 training is not supported yet: ignored"},
      {"float8.precompute_float8_dynamic_scale_for_fsdp", is_true, "float8 training is not supported yet: ignored"},
      {"float8.recipe_name", is_set, "float8 training is not supported yet: ignored"},
      {"float8.emulate", is_true, "float8 training is not supported yet: ignored"},
  };
  return rows;
}

// torchtitan sections titan has no fields for: any key in them loads, with a note.
constexpr std::string_view kRecognisedSections[] = {
    "fault_tolerance", "memory_estimation", "experimental", "quantize.linear.mx", "quantize.grouped_mm",
};

const std::string_view* recognised_section_of(std::string_view canonical) {
  for (const std::string_view& section : kRecognisedSections) {
    if (canonical.starts_with(section) && (canonical.size() == section.size() || canonical[section.size()] == '.')) {
      return &section;
    }
  }
  return nullptr;
}

}  // namespace

std::optional<std::string> recognised_unsupported_note(std::string_view canonical, std::string_view value) {
  const std::string_view* section = recognised_section_of(canonical);
  if (section == nullptr) return std::nullopt;
  return fmt::format("{} = {}: [{}] is recognised but not supported by titan: ignored", canonical, value, *section);
}

bool is_recognised_unsupported_table(std::string_view canonical) {
  return recognised_section_of(canonical) != nullptr;
}

std::vector<std::string_view> recognised_unsupported_sections() {
  return {std::begin(kRecognisedSections), std::end(kRecognisedSections)};
}

}  // namespace config_detail

std::vector<std::string> unsupported_notes(const JobConfig& config) {
  const nlohmann::json effective = to_json(config);
  std::vector<std::string> notes;
  for (const auto& row : config_detail::unsupported_table()) {
    const nlohmann::json& value = effective.at(config_detail::pointer_of(row.key));
    if (row.fires(value)) notes.push_back(fmt::format("{} = {}: {}", row.key, value.dump(), row.why));
  }
  return notes;
}

}  // namespace titan
