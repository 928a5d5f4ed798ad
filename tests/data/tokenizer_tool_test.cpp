// SPDX-License-Identifier: BSD-3-Clause
// titan-tokenizer reads its corpus as the trainer reads the job's: --input in the format and text field of
// training.dataset_format and training.dataset_text_field; the flags those keys replaced name them.
#include "test_util.hpp"
#include "titan/data/tokenizer.hpp"
#include "tool_run.hpp"

#include <nlohmann/json.hpp>

#include <fstream>

using Catch::Contains;
namespace fs = std::filesystem;

TEST_CASE("titan-tokenizer trains on a JSONL corpus described by the job's dataset keys", "[data][tokenizer][tools]") {
  titan::test::TempDir dir;
  // The text sits in "body"; "text" (the default field) is absent.
  const fs::path corpus = dir.path / "corpus.jsonl";
  {
    std::ifstream in(titan::test::tinyshakespeare());
    std::ofstream out(corpus);
    int lines = 0;
    for (std::string line; std::getline(in, line) && lines < 2000; ++lines) {
      if (!line.empty()) out << nlohmann::json{{"body", line}}.dump() << "\n";
    }
  }
  const std::vector<std::string> base = {
      "train", "--input", corpus.string(), "--vocab-size", "300", "--training.dataset_format", "jsonl"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return titan::test::run_tool("titan-tokenizer", args);
  };
  const fs::path out = dir.path / "tok";
  const titan::test::ToolRun good = with({"--training.dataset_text_field", "body", "--output", out.string()});
  INFO(good.output);
  REQUIRE(good.code == 0);
  CHECK(titan::data::load_tokenizer(out)->vocab_size() == 300);
  // Without the field key, the default field is looked for and its absence named.
  const titan::test::ToolRun missing = with({"--output", (dir.path / "tok2").string()});
  CHECK(missing.code == 1);
  CHECK_THAT(missing.output, Contains("\"text\""));
  const titan::test::ToolRun old = with({"--text-field", "body", "--output", out.string()});
  CHECK(old.code == 1);
  CHECK_THAT(old.output, Contains("expected --training.dataset_text_field KEY") && Contains("got --text-field"));
}
