// SPDX-License-Identifier: BSD-3-Clause
// The command line, tyro style as torchtitan v0.2.2 takes it: `--section.key value`, `--section.key=value`,
// `--section.flag`, `--section.no_flag`, comma-separated lists; then the layers are applied in order.
#include "config_detail.hpp"

#include <fmt/format.h>

#include <type_traits>

namespace titan {
namespace config_detail {
namespace {

struct Override {
  std::string key;  // as written, after the leading "--"
  std::string value;
};

struct Command {
  std::optional<std::string> preset;
  std::vector<Override> overrides;
};

bool is_bool_key(JobConfig& probe, std::string_view canonical) {
  bool is_bool = false;
  visit_key(probe, canonical,
            [&](auto& field) { is_bool = std::is_same_v<std::remove_cvref_t<decltype(field)>, bool>; });
  return is_bool;
}

// `section.no_flag` -> `section.flag` when that is a boolean key.
std::optional<std::string> negated_bool_key(JobConfig& probe, std::string_view canonical) {
  const size_t dot = canonical.rfind('.');
  if (dot == std::string_view::npos || canonical.substr(dot + 1).rfind("no_", 0) != 0) return std::nullopt;
  std::string positive = std::string(canonical.substr(0, dot + 1)) + std::string(canonical.substr(dot + 4));
  if (!is_bool_key(probe, positive)) return std::nullopt;
  return positive;
}

Command tokenize(int argc, const char* const argv[]) {
  Command command;
  JobConfig probe;  // only asked which keys are booleans
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_next = i + 1 < argc;
    if (arg == "--config" || arg.starts_with("--config=")) {
      if (arg == "--config" && !has_next) fail("config", "expected a preset name after --config, got nothing.");
      command.preset = arg == "--config" ? std::string(argv[++i]) : std::string(arg.substr(9));
      continue;
    }
    if (!arg.starts_with("--") || arg.size() == 2) {
      fail("", fmt::format("expected --section.key arguments, got '{}'. Run with --help to list every key.", arg));
    }
    const std::string_view body = arg.substr(2);
    const size_t eq = body.find('=');
    const std::string key(body.substr(0, eq));
    const std::string canonical = canonical_key(key);
    if (const auto positive = negated_bool_key(probe, canonical)) {
      if (eq != std::string_view::npos) fail(key, fmt::format("--{} takes no value, got '{}'.", key, arg));
      command.overrides.push_back({*positive, "false"});
      continue;
    }
    const bool recognised = is_recognised_unsupported_table(canonical);
    if (!recognised && !is_known_key(canonical)) unknown_key(key, kCommandLine);
    if (eq != std::string_view::npos) {
      command.overrides.push_back({key, std::string(body.substr(eq + 1))});
      continue;
    }
    // Keys of sections without fields have no known type: a following flag means this one is a flag.
    const bool flag_only = recognised && (!has_next || std::string_view(argv[i + 1]).starts_with("--"));
    if (flag_only) {
      command.overrides.push_back({key, "true"});
      continue;
    }
    if (is_bool_key(probe, canonical)) {
      // `--x.flag` alone means true; `--x.flag false` is also accepted.
      if (has_next && parse_bool(argv[i + 1])) {
        command.overrides.push_back({key, argv[++i]});
      } else {
        command.overrides.push_back({key, "true"});
      }
      continue;
    }
    if (!has_next) fail(key, fmt::format("expected a value after --{}, got nothing. Write --{} VALUE.", key, key));
    command.overrides.push_back({key, argv[++i]});
  }
  return command;
}

}  // namespace
}  // namespace config_detail

using namespace config_detail;

bool help_requested(int argc, const char* const argv[]) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") return true;
  }
  return false;
}

JobConfig parse_args(int argc, const char* const argv[], ConfigNotes* notes) {
  JobConfig config;
  if (help_requested(argc, argv)) {
    if (notes != nullptr) notes->help_requested = true;
    return config;
  }
  const Command command = tokenize(argc, argv);
  if (command.preset) apply_preset(config, *command.preset);

  // The file layer comes before every override, wherever --job.config_file sits on the line.
  std::optional<std::string> file = config.job.config_file;
  for (const Override& o : command.overrides) {
    if (canonical_key(o.key) == "job.config_file") from_text(file, o.value, {o.key, kCommandLine});
  }
  if (file) apply_json(config, read_config_file(*file), *file, notes);

  for (const Override& o : command.overrides) apply_override(config, o.key, o.value, notes);
  for (std::string& note : unsupported_notes(config)) add_note(notes, std::move(note));
  validate(config);
  return config;
}

}  // namespace titan
