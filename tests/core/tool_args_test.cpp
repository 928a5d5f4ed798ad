// SPDX-License-Identifier: BSD-3-Clause
// Tests for core/tool_args.hpp: a tool's own flags beside the trainer's config layers, its refusals and --help.
#include "test_util.hpp"

#include "titan/core/tool_args.hpp"

#include <string>
#include <vector>

namespace {

using Catch::Contains;
namespace fs = std::filesystem;

const titan::ToolSpec kSpec = {
    .name = "titan-demo",
    .usage = "usage: titan-demo COMMAND --input PATH [--greedy] [config keys]\n",
    .flags = {{.name = "--input", .value = "PATH", .help = "the file to read"},
              {.name = "--count", .value = "N", .help = "how many"},
              {.name = "--scale", .value = "X", .help = "a factor"},
              {.name = "--greedy", .help = "a switch"},
              {.name = "--output", .value = "FILE", .help = "where to write", .alias = "-o"}},
    .renamed = {{.flag = "--flavor", .instead = "--model.flavor NAME"}},
    .keys = "model.name, model.flavor",
    .words = "the command"};

titan::ToolArgs parse_tool(std::vector<std::string> args, const titan::ToolSpec& spec = kSpec) {
  args.insert(args.begin(), "titan-demo");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return titan::parse_tool_args(spec, static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("tool args: own flags and words and the trainer's config layers in one line", "[core][tool_args]") {
  titan::test::TempDir dir;
  const fs::path job = dir.path / "job.toml";
  titan::test::write_file(job, "[model]\nname = \"qwen3\"\nflavor = \"0.6B\"\n[training]\nsteps = 7\n");
  const titan::ToolArgs args = parse_tool({"to-hf", "--input", "a.bin", "--model.flavor", "debugmodel", "--greedy",
                                           "--count=-3", "--job.config_file", job.string(), "-o", "out",
                                           "--training.global_batch_size", "-1", "--input", "b.bin"});
  CHECK(args.words == std::vector<std::string>{"to-hf"});
  // The file layer, then the command line over it, wherever the file sits on the line.
  CHECK(args.config.model.name == "qwen3");
  CHECK(args.config.model.flavor == "debugmodel");
  CHECK(args.config.training.steps == 7);
  CHECK(args.config.training.global_batch_size == -1);  // a value after a key goes with the key, dash or not
  CHECK(args.value("--input") == "b.bin");              // the last one wins; every one is kept
  CHECK(args.values("--input") == std::vector<std::string>{"a.bin", "b.bin"});
  CHECK(args.integer("--count", 5) == -3);  // a value is taken as given, "-3" included
  CHECK(args.integer("--missing", 5) == 5);
  CHECK(args.number("--scale", 0.5) == 0.5);
  CHECK(args.has("--greedy"));
  CHECK(!args.has("--scale"));
  CHECK(args.value("--output") == "out");  // the alias lands on the flag's name
  CHECK(!args.help);
}

TEST_CASE("tool args: renamed and unknown and malformed flags are refused naming what to write", "[core][tool_args]") {
  // A flag a config key replaced names the key.
  CHECK_THAT(titan::test::error_of([] {
               parse_tool({"--flavor", "8B"});
             }),
             Contains("[titan-demo] expected --model.flavor NAME (the trainer's config key), got --flavor"));
  CHECK_THAT(titan::test::error_of([] { parse_tool({"--flavor=8B"}); }), Contains("expected --model.flavor NAME"));
  // A dotless flag that is not its own lists its own flags.
  CHECK_THAT(titan::test::error_of([] {
               parse_tool({"--inptu", "a"});
             }),
             Contains("expected one of its flags (--input PATH, --count N, --scale X, --greedy, --output, -o FILE)") &&
                 Contains("got '--inptu'"));
  // A misspelled config key is the config parser's error, naming the key.
  CHECK_THAT(titan::test::error_of([] { parse_tool({"--model.flavr", "x"}); }), Contains("model.flavr"));
  CHECK_THAT(titan::test::error_of([] { parse_tool({"--input"}); }),
             Contains("[titan-demo] expected a value after --input (PATH), got none."));
  CHECK_THAT(titan::test::error_of([] { parse_tool({"--greedy=yes"}); }), Contains("expected --greedy alone"));
  CHECK_THAT(titan::test::error_of([] {
               parse_tool({"--count", "many"}).integer("--count", 1);
             }),
             Contains("[titan-demo] expected a whole number after --count, got 'many'."));
  CHECK_THAT(titan::test::error_of([] {
               parse_tool({"--scale", "2x"}).number("--scale", 1);
             }),
             Contains("expected a number after --scale, got '2x'."));
  CHECK_THAT(titan::test::error_of([] { parse_tool({}).required("--input"); }),
             Contains("[titan-demo] expected --input, got none."));
  // Words are taken only before the first flag, and only by a program that takes any.
  titan::ToolSpec no_words = kSpec;
  no_words.words.clear();
  CHECK_THAT(titan::test::error_of([&] {
               parse_tool({"stray", "--greedy"}, no_words);
             }),
             Contains("[titan-demo] expected flags only") && Contains("got 'stray'"));
}

TEST_CASE("tool args: --help reads nothing else and lists the own flags and every config key", "[core][tool_args]") {
  const titan::ToolArgs args = parse_tool({"--flavor", "8B", "--help", "--no-such-flag"});
  CHECK(args.help);
  const std::string help = titan::tool_help(kSpec);
  CHECK_THAT(help, Contains("usage: titan-demo COMMAND") && Contains("  --output, -o FILE  where to write") &&
                       Contains("--flavor -> --model.flavor NAME") && Contains("titan-demo reads model.name") &&
                       Contains("--job.config_file") && Contains("--training.steps"));
}
