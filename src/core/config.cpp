// SPDX-License-Identifier: BSD-3-Clause
// The strict layer applier: one walk over the reflected fields serves JSON/TOML trees, single CLI
// overrides and the JSON dump, so every source checks keys and types the same way.
#include "config_detail.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace titan {
namespace config_detail {

void fail(std::string key, std::string_view message) {
  throw ConfigError(std::move(key), fmt::format("[titan::config] {}", message));
}

namespace {

// torchtitan v0.2.2 keeps float8 under [quantize.linear.float8]; titan flattens it to [float8].
constexpr std::string_view kFloat8Alias = "quantize.linear.float8";
constexpr std::string_view kFloat8Section = "float8";

bool has_prefix(std::string_view key, std::string_view prefix) {
  return key == prefix || (key.size() > prefix.size() && key.starts_with(prefix) && key[prefix.size()] == '.');
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string_view last_part(std::string_view key) {
  const size_t dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

// The closest schema key: by whole key (typos), or by field name alone (wrong or missing section,
// e.g. `steps` at the top of a TOML file), whichever is nearer.
std::string closest_key(std::string_view canonical) {
  std::string best;
  size_t best_score = std::max<size_t>(2, canonical.size() / 3) + 1;
  for (const std::string& key : config_keys()) {
    const size_t score =
        std::min(edit_distance(canonical, key), edit_distance(last_part(canonical), last_part(key)) + 2);
    if (score < best_score) {
      best_score = score;
      best = key;
    }
  }
  return best;
}

// Flattens a tree to (dotted key, leaf) pairs; empty tables are leaves too so unknown ones are caught.
void flatten(const json& node, const std::string& prefix, std::vector<std::pair<std::string, const json*>>& out) {
  if (!node.is_object() || (node.empty() && !prefix.empty())) {
    out.emplace_back(prefix, &node);
    return;
  }
  for (const auto& [key, child] : node.items()) flatten(child, prefix.empty() ? key : prefix + "." + key, out);
}

}  // namespace

std::string canonical_key(std::string_view key) {
  std::string canonical(key);
  std::replace(canonical.begin(), canonical.end(), '-', '_');
  if (has_prefix(canonical, kFloat8Alias)) {
    canonical.replace(0, kFloat8Alias.size(), kFloat8Section);
  }
  return canonical;
}

void unknown_key(std::string_view key, std::string_view origin) {
  std::string suggestion = closest_key(canonical_key(key));
  // Suggest in the spelling the user used.
  if (!suggestion.empty() && has_prefix(canonical_key(key), kFloat8Section) && has_prefix(key, kFloat8Alias)) {
    suggestion.replace(0, kFloat8Section.size(), kFloat8Alias);
  }
  const std::string hint = suggestion.empty() ? std::string("Run with --help to list every key.")
                                              : fmt::format("Did you mean '{}'?", suggestion);
  fail(std::string(key), fmt::format("unknown key '{}' in {}. {}", key, origin, hint));
}

bool is_table_key(std::string_view canonical) {
  if (is_recognised_unsupported_table(canonical)) return true;
  if (canonical == "quantize" || canonical == "quantize.linear") return true;
  const std::vector<std::string> keys = config_keys();
  return std::any_of(keys.begin(), keys.end(), [&](const std::string& key) {
    return key.size() > canonical.size() && has_prefix(key, canonical);
  });
}

bool is_known_key(std::string_view canonical) {
  const std::vector<std::string> keys = config_keys();
  return std::find(keys.begin(), keys.end(), canonical) != keys.end();
}

json::json_pointer pointer_of(std::string_view dotted_key) {
  std::string pointer(1, '/');
  pointer += dotted_key;
  std::replace(pointer.begin(), pointer.end(), '.', '/');
  return json::json_pointer(pointer);
}

void add_note(ConfigNotes* notes, std::string note) {
  if (notes != nullptr && std::find(notes->begin(), notes->end(), note) == notes->end()) {
    notes->push_back(std::move(note));
  }
}

}  // namespace config_detail

using namespace config_detail;

void apply_json(JobConfig& config, const nlohmann::json& tree, std::string_view origin, ConfigNotes* notes) {
  if (!tree.is_object()) {
    fail("", fmt::format("expected a table of sections in {}, got {}. Write [section] tables of key = value.", origin,
                         tree.type_name()));
  }
  std::vector<std::pair<std::string, const json*>> leaves;
  flatten(tree, "", leaves);
  for (const auto& [key, value] : leaves) {
    const std::string canonical = canonical_key(key);
    if (auto note = recognised_unsupported_note(canonical, value->dump())) {
      add_note(notes, std::move(*note));
      continue;
    }
    if (value->is_object()) {  // an empty table
      if (!is_table_key(canonical)) unknown_key(key, origin);
      continue;
    }
    const bool found = visit_key(config, canonical, [&](auto& field) {
      from_json_value(field, *value, {key, origin});
    });
    if (found) continue;
    if (is_table_key(canonical)) {
      fail(key,
           fmt::format("{} is a table, got {} in {}. Write its keys under [{}].", key, value->dump(), origin, key));
    }
    unknown_key(key, origin);
  }
}

void apply_override(JobConfig& config, std::string_view key, std::string_view value, ConfigNotes* notes) {
  const std::string canonical = canonical_key(key);
  if (auto note = recognised_unsupported_note(canonical, quoted(value))) {
    add_note(notes, std::move(*note));
    return;
  }
  const bool found = visit_key(config, canonical, [&](auto& field) { from_text(field, value, {key, kCommandLine}); });
  if (!found) unknown_key(key, kCommandLine);
}

nlohmann::json to_json(const JobConfig& config) {
  json tree = json::object();
  detail::for_each_leaf(config, "", [&](std::string_view key, std::string_view, std::string_view, const auto& value) {
    tree[pointer_of(key)] = to_json_value(value);
  });
  return tree;
}

JobConfig from_json(const nlohmann::json& tree) {
  JobConfig config;
  apply_json(config, tree, "JSON");
  return config;
}

std::vector<std::string> config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    const JobConfig defaults;
    detail::for_each_leaf(defaults, "", [&](std::string_view key, std::string_view, std::string_view, const auto&) {
      out.emplace_back(key);
    });
    return out;
  }();
  return keys;
}

}  // namespace titan
