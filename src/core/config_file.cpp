// SPDX-License-Identifier: BSD-3-Clause
// Config files in and out: TOML (toml++) or JSON read into one nlohmann tree for apply_json, and the
// effective config written atomically as JSON.
#include "config_detail.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace titan {
namespace config_detail {
namespace {

json toml_to_json(const toml::node& node, const std::string& key, const std::string& file) {
  if (const auto* table = node.as_table()) {
    json out = json::object();
    for (const auto& [name, child] : *table) {
      const std::string child_key = key.empty() ? std::string(name.str()) : key + "." + std::string(name.str());
      out[std::string(name.str())] = toml_to_json(child, child_key, file);
    }
    return out;
  }
  if (const auto* array = node.as_array()) {
    json out = json::array();
    for (const auto& child : *array) out.push_back(toml_to_json(child, key, file));
    return out;
  }
  if (const auto* v = node.as_string()) return v->get();
  if (const auto* v = node.as_integer()) return v->get();
  if (const auto* v = node.as_floating_point()) return v->get();
  if (const auto* v = node.as_boolean()) return v->get();
  const auto& where = node.source().begin;
  fail(key, fmt::format("{} expects a string, number, boolean or list, got a date/time at {}:{}:{}. "
                        "Quote it to make it a string.",
                        key, file, where.line, where.column));
}

std::string read_text(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    fail("job.config_file", fmt::format("expected a config file at '{}', got no such file (current directory "
                                        "'{}'). Check --job.config_file.",
                                        file.string(), std::filesystem::current_path(ec).string()));
  }
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in)
    fail("job.config_file", fmt::format("expected a readable config file, got a read error on '{}'.", file.string()));
  return text.str();
}

}  // namespace
}  // namespace config_detail

using namespace config_detail;

nlohmann::json read_config_file(const std::filesystem::path& file) {
  const std::string text = read_text(file);
  const std::string name = file.string();
  if (file.extension() == ".json") {
    try {
      return json::parse(text);
    } catch (const json::parse_error& e) {
      fail("job.config_file", fmt::format("could not parse JSON file '{}': {}. Fix the syntax.", name, e.what()));
    }
  }
  try {
    return toml_to_json(toml::parse(text, name), "", name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    fail("job.config_file", fmt::format("could not parse TOML file '{}' at line {}, column {}: {}. Fix the syntax.",
                                        name, where.line, where.column, e.description()));
  }
}

void write_config_json(const JobConfig& config, const std::filesystem::path& file) {
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  // Write beside the target, then rename: readers never see a half-written file.
  std::filesystem::path temp = file;
  temp += fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << to_json(config).dump(2) << '\n';
    out.flush();
    TITAN_CHECK(out.good(),
                "[titan::config] expected to write '{}', got a write error. Check the disk and "
                "permissions.",
                temp.string());
  }
  std::filesystem::rename(temp, file);
}

}  // namespace titan
