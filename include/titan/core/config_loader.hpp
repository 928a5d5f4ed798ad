// SPDX-License-Identifier: BSD-3-Clause
// Building a JobConfig from its layers, later wins: struct defaults < named preset (--config NAME) < TOML
// or JSON file (--job.config_file) < --section.key overrides. Every layer is checked against the schema
// in core/config.hpp: unknown keys and wrong types throw titan::ConfigError. See docs/config.md.
//
// Example:
//   titan::ConfigNotes notes;
//   titan::JobConfig cfg = titan::parse_args(argc, argv, &notes);
//   if (notes.help_requested) { fmt::print("{}", titan::config_help()); return 0; }
//   for (const auto& note : notes) titan::log::warn("{}", note);
#pragma once

#include "titan/core/config.hpp"
#include "titan/core/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

/// Notes for the caller to log as warnings: keys titan reads but does not act on yet (only when set to a
/// non-default value). `help_requested` is set by -h/--help.
struct ConfigNotes : std::vector<std::string> {
  bool help_requested = false;
};

/// Parses `argv[1..argc)`: [--config PRESET] [--job.config_file FILE] [--section.key VALUE |
/// --section.key=VALUE | --section.flag | --section.no_flag]... Validates the result (see validate).
/// With -h/--help, returns the defaults untouched and sets notes->help_requested.
JobConfig parse_args(int argc, const char* const argv[], ConfigNotes* notes = nullptr);

/// True when argv holds -h or --help.
bool help_requested(int argc, const char* const argv[]);

/// Applies a JSON tree shaped like the TOML file ({"training": {"steps": 10}, ...}) onto `config`.
/// `origin` names the source in errors ("run.toml"). torchtitan's [quantize.linear.float8] is accepted
/// for [float8]; recognised-but-unsupported sections are accepted with a note.
void apply_json(JobConfig& config, const nlohmann::json& tree, std::string_view origin = "JSON",
                ConfigNotes* notes = nullptr);

/// Reads a TOML file (or JSON, when the name ends in .json) into the same tree apply_json takes.
nlohmann::json read_config_file(const std::filesystem::path& file);

/// Applies one `section.key` override given as text, as the command line does ("10", "a,b", "true").
void apply_override(JobConfig& config, std::string_view key, std::string_view value, ConfigNotes* notes = nullptr);

/// Every field as {"section": {"key": value}}, unset optionals as null.
nlohmann::json to_json(const JobConfig& config);

/// The effective config as a JSON object, then apply_json: `from_json(to_json(c))` equals `c`.
JobConfig from_json(const nlohmann::json& tree);

/// Writes to_json(config) to `file` atomically (temp file + rename), creating parent folders.
void write_config_json(const JobConfig& config, const std::filesystem::path& file);

/// One line per key, grouped by section: `--section.key <type> (default: X)  meaning`.
std::string config_help();

/// Every dotted key of the schema, in declaration order (`job.config_file`, ...).
std::vector<std::string> config_keys();

/// Throws ConfigError naming the first key with an impossible value (steps <= 0, unknown decay_type, ...).
void validate(const JobConfig& config);
/// The [optimizer] part of validate(JobConfig), for an optimizer built from code with a config of its own.
void validate(const OptimizerConfig& optimizer);

/// The notes for keys set to a value titan does not support yet (see src/core/config_support.cpp).
std::vector<std::string> unsupported_notes(const JobConfig& config);

/// Registers (or replaces) a preset for --config NAME; `apply` edits a default-constructed config.
void register_preset(std::string name, std::function<void(JobConfig&)> apply);

/// Applies preset `name` onto `config`; unknown names throw ConfigError listing the presets.
void apply_preset(JobConfig& config, std::string_view name);

/// The registered preset names, sorted.
std::vector<std::string> preset_names();

}  // namespace titan
