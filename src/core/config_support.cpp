// SPDX-License-Identifier: BSD-3-Clause
// What titan reads but does not act on yet, in one place: each row is one loud warning at start (a
// ConfigNotes entry the main logs), never a silent no-op. A row fires only when its switch asks for a
// missing feature; no default does.
// Degrees of layouts titan cannot build also stop the trainer with an error.
// When a feature lands, delete its row (and its section from kRecognisedSections).
#include "config_detail.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace titan {
namespace config_detail {
namespace {

// model.converters other than float8 and lora (which work).
bool has_unsupported_converter(const json& v) {
  return std::any_of(v.begin(), v.end(), [](const json& name) {
    return !is_float8_converter(name.get<std::string>()) && name.get<std::string>() != "lora";
  });
}

struct Unsupported {
  std::string_view key;
  std::function<bool(const json&)> fires;  // given the key's effective value
  std::string_view why;
};

bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_non_empty(const json& v) { return v.is_string() ? !v.get<std::string>().empty() : !v.empty(); }
auto not_equal(std::string expected) {
  return [expected = std::move(expected)](const json& v) { return v != expected; };
}

const std::vector<Unsupported>& unsupported_table() {
  static const std::vector<Unsupported> rows = {
      {"job.custom_config_module", is_non_empty,
       "titan has no Python config extensions (use register_preset): ignored"},
      {"model.converters", has_unsupported_converter,
       "only the float8 and lora converters are supported so far (mx and grouped-mm converters are not): those are "
       "ignored"},
      {"optimizer.early_step_in_backward", is_true,
       "stepping inside backward is not supported yet: the optimizer steps after backward"},
      {"training.enable_cpu_offload", is_true,
       "CPU offload is not supported yet (FSDP keeps params on the device): ignored"},
      {"training.dataloader.pin_memory", is_true, "pinned batches are not supported yet: ignored"},
      {"validation.dataloader.pin_memory", is_true, "pinned batches are not supported yet: ignored"},
      {"checkpoint.initial_load_in_hf_quantized", is_true, "quantized HF checkpoints are not supported yet: ignored"},
      {"compile.enable", is_true, "titan has no graph compiler yet: ignored"},
      {"comm.mode", not_equal("default"), "only real collectives so far (no fake_backend or local_tensor): ignored"},
      {"debug.moe_force_load_balance", is_true, "titan has no MoE model yet: ignored"},
  };
  return rows;
}

// torchtitan sections titan has no fields for: any key in them loads, with a note.
constexpr std::string_view kRecognisedSections[] = {
    "memory_estimation",
    "experimental",
    "quantize.linear.mx",
    "quantize.grouped_mm",
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

bool is_recognised_unsupported_table(std::string_view canonical) { return recognised_section_of(canonical) != nullptr; }

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
