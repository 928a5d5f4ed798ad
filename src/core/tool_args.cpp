// SPDX-License-Identifier: BSD-3-Clause
#include "titan/core/tool_args.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <iostream>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan {
namespace {

const ToolFlag* find_flag(const ToolSpec& spec, std::string_view name) {
  for (const ToolFlag& f : spec.flags) {
    if (f.name == name || (!f.alias.empty() && f.alias == name)) return &f;
  }
  return nullptr;
}

// "--prompt TEXT", "--output, -o FILE", "--greedy".
std::string spelled(const ToolFlag& f) {
  std::string out = f.alias.empty() ? f.name : fmt::format("{}, {}", f.name, f.alias);
  return f.value.empty() ? out : fmt::format("{} {}", out, f.value);
}

std::string flag_list(const ToolSpec& spec) {
  std::vector<std::string> names;
  for (const ToolFlag& f : spec.flags) names.push_back(spelled(f));
  return names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", "));
}

// Takes argv[i] (and its value) as an own flag; false when it is none.
bool take_flag(const ToolSpec& spec, int argc, const char* const argv[], int& i, ToolArgs& args) {
  const std::string_view arg = argv[i];
  const size_t eq = arg.find('=');
  const std::string_view name = arg.substr(0, eq);
  const ToolFlag* flag = find_flag(spec, name);
  if (flag == nullptr) return false;
  std::string value;
  if (flag->value.empty()) {
    TITAN_CHECK_VALUE(eq == std::string_view::npos, "[{}] expected {} alone (it takes no value), got '{}'.", spec.name,
                      flag->name, arg);
  } else if (eq != std::string_view::npos) {
    value = arg.substr(eq + 1);
  } else {
    TITAN_CHECK_VALUE(i + 1 < argc, "[{}] expected a value after {} ({}), got none.", spec.name, name, flag->value);
    value = argv[++i];
  }
  args.flags.emplace_back(flag->name, std::move(value));
  return true;
}

// All of `text` read by `read` (std::stoll, std::stod), or an error naming the flag.
template <class T, class Read>
T read_whole(const std::string& tool, std::string_view flag, const std::string& text, std::string_view kind,
             Read read) {
  size_t used = 0;
  T v{};
  try {
    v = read(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TITAN_CHECK_VALUE(!text.empty() && used == text.size(), "[{}] expected {} after {}, got '{}'.", tool, kind, flag,
                    text);
  return v;
}

}  // namespace

ToolArgs parse_tool_args(const ToolSpec& spec, int argc, const char* const argv[]) {
  ToolArgs args{.tool = spec.name};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      args.help = true;
      return args;
    }
  }
  int i = 1;
  for (; i < argc && !std::string_view(argv[i]).starts_with("-"); ++i) args.words.emplace_back(argv[i]);
  TITAN_CHECK_VALUE(args.words.empty() || !spec.words.empty(),
                    "[{}] expected flags only (its own: {}; or config keys --section.key VALUE), got '{}'. Run {} "
                    "--help.",
                    spec.name, flag_list(spec), args.words.empty() ? "" : args.words.front(), spec.name);
  std::vector<const char*> rest = {argc > 0 ? argv[0] : spec.name.c_str()};
  for (; i < argc; ++i) {
    if (take_flag(spec, argc, argv, i, args)) continue;
    const std::string_view arg = argv[i];
    const std::string_view name = arg.substr(0, arg.find('='));
    for (const RenamedFlag& r : spec.renamed) {
      TITAN_CHECK_VALUE(r.flag != name,
                        "[{}] expected {} (the trainer's config key), got {}, which {} no longer takes.", spec.name,
                        r.instead, name, spec.name);
    }
    // Every config key has a dot (section.key); a value after a key ("-3", "qwen3") goes with it.
    const bool own_looking = name.starts_with("--") && name != "--config" && name.find('.') == std::string_view::npos;
    TITAN_CHECK_VALUE(!own_looking,
                      "[{}] expected one of its flags ({}) or a config key (--section.key VALUE), got '{}'. Run {} "
                      "--help.",
                      spec.name, flag_list(spec), arg, spec.name);
    rest.push_back(argv[i]);
  }
  args.config = parse_args(static_cast<int>(rest.size()), rest.data(), &args.notes);
  return args;
}

bool ToolArgs::has(std::string_view flag) const {
  return std::any_of(flags.begin(), flags.end(), [&](const auto& f) { return f.first == flag; });
}

std::optional<std::string> ToolArgs::value(std::string_view flag) const {
  for (auto it = flags.rbegin(); it != flags.rend(); ++it) {
    if (it->first == flag) return it->second;
  }
  return std::nullopt;
}

std::vector<std::string> ToolArgs::values(std::string_view flag) const {
  std::vector<std::string> out;
  for (const auto& [name, value] : flags) {
    if (name == flag) out.push_back(value);
  }
  return out;
}

std::string ToolArgs::required(std::string_view flag) const {
  const std::optional<std::string> given = value(flag);
  TITAN_CHECK_VALUE(given.has_value(), "[{}] expected {}, got none. Run {} --help.", tool, flag, tool);
  return *given;
}

int64_t ToolArgs::integer(std::string_view flag, int64_t fallback) const {
  const std::optional<std::string> text = value(flag);
  return text ? read_whole<int64_t>(tool, flag, *text, "a whole number",
                                    [](const std::string& t, size_t* used) { return std::stoll(t, used); })
              : fallback;
}

double ToolArgs::number(std::string_view flag, double fallback) const {
  const std::optional<std::string> text = value(flag);
  return text ? read_whole<double>(tool, flag, *text, "a number",
                                   [](const std::string& t, size_t* used) { return std::stod(t, used); })
              : fallback;
}

std::string tool_help(const ToolSpec& spec) {
  std::string out = spec.usage;
  size_t width = 0;
  for (const ToolFlag& f : spec.flags) width = std::max(width, spelled(f).size());
  if (!spec.flags.empty()) out += "\nIts own flags:\n";
  for (const ToolFlag& f : spec.flags) out += fmt::format("  {:<{}}  {}\n", spelled(f), width, f.help);
  if (!spec.renamed.empty()) {
    out += "\nFlags it took before, now config keys:\n";
    for (const RenamedFlag& r : spec.renamed) out += fmt::format("  {} -> {}\n", r.flag, r.instead);
  }
  out += fmt::format(
      "\nEvery key of the job's config is accepted too, in the trainer's layers\n(--config PRESET, "
      "--job.config_file FILE, --section.key VALUE); {} reads {}.\n\n{}",
      spec.name, spec.keys.empty() ? "none of them" : spec.keys, config_help());
  return out;
}

int run_tool(const ToolSpec& spec, int argc, const char* const argv[],
             const std::function<int(const ToolArgs&)>& body) {
  try {
    const ToolArgs args = parse_tool_args(spec, argc, argv);
    if (args.help) {
      std::cout << tool_help(spec);
      return 0;
    }
    for (const auto& note : args.notes) log::warn("{}", note);
    return body(args);
  } catch (const std::exception& e) {
    std::cerr << spec.name << ": " << error_message(e) << "\n";
    return 1;
  }
}

}  // namespace titan
