// SPDX-License-Identifier: BSD-3-Clause
// A program's command line in the trainer's language: the job's config layers (--config PRESET,
// --job.config_file FILE, --section.key VALUE, read by parse_args) plus the program's own flags, only for what
// no config key says (a path to read or write, a prompt, a sampling knob). Every titan tool reads its line
// through this, so a user who trains with `--model.flavor 8B` converts, plans and generates with it too.
//
// Example:
//   const titan::ToolSpec spec = {.name = "my-tool", .usage = "usage: my-tool --input PATH [config keys]\n",
//                                 .flags = {{.name = "--input", .value = "PATH", .help = "the file to read"}},
//                                 .keys = "model.name, model.flavor"};
//   int main(int argc, char** argv) {
//     return titan::run_tool(spec, argc, argv, [](const titan::ToolArgs& args) {
//       const std::string input = args.required("--input");
//       return 0;
//     });
//   }
#pragma once

#include "titan/core/config_loader.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace titan {

/// One flag of a program's own.
struct ToolFlag {
  /// As typed, dashes included: "--prompt".
  std::string name{};
  /// Its value's placeholder in --help ("TEXT", "N"); empty for a switch that takes none (--greedy).
  std::string value{};
  /// One line for --help.
  std::string help{};
  /// A second spelling ("-o" for "--output"); empty for none.
  std::string alias{};
};

/// A flag a program took before a config key covered it: refused, with the spelling to use instead.
struct RenamedFlag {
  /// The old flag: "--flavor".
  std::string flag{};
  /// What to write instead: "--model.flavor NAME".
  std::string instead{};
};

/// What a program takes on its command line.
struct ToolSpec {
  /// The program as errors and --help name it: "titan-generate".
  std::string name{};
  /// The usage lines --help prints first.
  std::string usage{};
  /// Its own flags.
  std::vector<ToolFlag> flags{};
  /// Flags it no longer takes.
  std::vector<RenamedFlag> renamed{};
  /// The config keys it reads, for --help ("model.name, model.flavor, checkpoint.export_dtype").
  std::string keys{};
  /// What the words before the first flag are, for errors ("the command", "run folders"); empty: none taken.
  std::string words{};
};

/// A parsed command line.
struct ToolArgs {
  /// The program, for error messages.
  std::string tool{};
  /// The job config of every argument that is no own flag (parse_args' layers); the defaults under --help.
  JobConfig config{};
  /// Warnings for the caller to log (parse_args' notes).
  ConfigNotes notes{};
  /// The own flags given, in order, as (name, value); a switch's value is empty.
  std::vector<std::pair<std::string, std::string>> flags{};
  /// The words before the first flag (a command, run folders).
  std::vector<std::string> words{};
  /// -h or --help was given: nothing else was read.
  bool help = false;

  /// True when `flag` was given.
  bool has(std::string_view flag) const;
  /// The last value of `flag`, if given.
  std::optional<std::string> value(std::string_view flag) const;
  /// Every value of `flag`, in order.
  std::vector<std::string> values(std::string_view flag) const;
  /// The last value of `flag`; an error naming it when it was not given.
  std::string required(std::string_view flag) const;
  /// The last value of `flag` as a whole number, or `fallback`; an error naming the flag when it is not one.
  int64_t integer(std::string_view flag, int64_t fallback) const;
  /// The last value of `flag` as a number, or `fallback`; an error naming the flag when it is not one.
  double number(std::string_view flag, double fallback) const;
};

/// Splits argv by `spec`: the words before the first flag, the own flags (`--name VALUE`, `--name=VALUE`, a
/// switch alone; a value is taken as given, "-3" included) and the rest, which parse_args turns into the
/// job config. A renamed flag is refused naming what to write; any other `--word` without a dot is refused
/// listing the own flags; a config key parse_args does not know is refused by it.
ToolArgs parse_tool_args(const ToolSpec& spec, int argc, const char* const argv[]);

/// --help: the usage, the own flags one a line, the keys the program reads, then every config key.
std::string tool_help(const ToolSpec& spec);

/// A program's main: parses argv by `spec`, prints --help, logs parse_args' notes as warnings and returns what
/// `body` returns. An exception becomes "<spec.name>: <message>" on stderr (no backtrace) and exit status 1, so
/// every tool fails the same way.
int run_tool(const ToolSpec& spec, int argc, const char* const argv[], const std::function<int(const ToolArgs&)>& body);

}  // namespace titan
