// SPDX-License-Identifier: BSD-3-Clause
// titan-eval and titan-generate on a LoRA run's checkpoint: the model gets the checkpoint's adapters back (rank,
// alpha and targets as saved), so its scores are the trained model's, equal to those of the merged HF export
// (titan-convert to-hf folds W + alpha/rank B A), not the frozen base's. An adapter-only checkpoint, which holds no
// base, is refused with the command that folds it into one.
//
// Tolerance, 2e-5 per scored token: in place the model computes W x + s B (A x), the merged export (W + s B A) x,
// each in fp32 with other reduction orders. peft_test.cpp argues that this moves the debug model's logits by under
// 1e-5; a token's log-softmax moves by at most twice its logits' largest change, and a request sums its tokens'. The
// adapters of a 3-step run at lr 2e-2 move a request's log-likelihood by far more (checked: > 1e-3 somewhere).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sstream>

#include "test_util.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "tool_run.hpp"
#include "train/train_test_util.hpp"

namespace titan_eval_lora_test {

using namespace titan;
namespace fs = std::filesystem;

constexpr double kPerTokenTolerance = 2e-5;

JobConfig lora_run(const fs::path& dump, bool adapter_only) {
  JobConfig c = test::tinyshakespeare_job(dump, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/3, /*seed=*/11);
  c.model.converters = {"lora"};
  c.lora = {.rank = 4, .alpha = 16, .target_modules = {"wq", "wv", "w2"}, .save_adapter_only = adapter_only};
  c.optimizer.lr = 2e-2;
  c.lr_scheduler.warmup_steps = 1;
  c.checkpoint.enable = true;
  c.metrics.disable_color_printing = true;
  return c;
}

test::ToolRun eval_tool(const fs::path& checkpoint) {
  return test::run_tool("titan-eval",
                        {"--checkpoint", checkpoint.string(), "--model.hf_assets_path", test::test_tokenizer().string(),
                         "--tasks", (test::test_dir() / "assets" / "eval").string(), "--max-length", "64", "--limit",
                         "6", "--output", "jsonl", "--samples"},
                        300);
}

// Every request's (log-likelihood, scored tokens), in task and document order.
std::vector<std::pair<double, int64_t>> scores(const fs::path& checkpoint) {
  const test::ToolRun run = eval_tool(checkpoint);
  INFO(run.output);
  REQUIRE(run.code == 0);
  std::vector<std::pair<double, int64_t>> out;
  std::istringstream in(run.output);
  for (std::string line; std::getline(in, line);) {
    const size_t brace = line.find("{\"");
    if (brace == std::string::npos) continue;
    const nlohmann::json result = nlohmann::json::parse(line.substr(brace));  // alive through the loop (C++20)
    for (const nlohmann::json& doc : result.at("docs")) {
      for (const nlohmann::json& r : doc.at("responses")) out.emplace_back(r[0].get<double>(), r[2].get<int64_t>());
    }
  }
  REQUIRE(!out.empty());
  return out;
}

fs::path to_hf(const fs::path& step, const fs::path& out, bool drop_adapters) {
  std::vector<std::string> args = {"to-hf", "--input", step.string(), "--output", out.string()};
  if (drop_adapters) args.insert(args.end(), {"--adapters", "drop"});
  const test::ToolRun run = test::run_tool("titan-convert", args);
  INFO(run.output);
  REQUIRE(run.code == 0);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::test_tokenizer() / file, out / file);
  return out;
}

}  // namespace titan_eval_lora_test

using namespace titan_eval_lora_test;

TEST_CASE("titan-eval scores a LoRA checkpoint with its adapters, as the merged HF export and not as the base",
          "[eval][tools][lora][full]") {
  test::TempDir dir;
  Trainer<llama3::Llama3>(lora_run(dir.path / "run", /*adapter_only=*/false)).train();
  const fs::path step = dir.path / "run" / "checkpoint" / "step-3";
  const auto in_place = scores(step);
  const auto merged = scores(to_hf(step, dir.path / "merged", /*drop_adapters=*/false));
  const auto base = scores(to_hf(step, dir.path / "base", /*drop_adapters=*/true));
  REQUIRE(merged.size() == in_place.size());
  REQUIRE(base.size() == in_place.size());
  double adapters_move = 0;
  for (size_t i = 0; i < in_place.size(); ++i) {
    INFO("request " << i);
    CHECK(std::abs(in_place[i].first - merged[i].first) <=
          kPerTokenTolerance * static_cast<double>(in_place[i].second));
    adapters_move = std::max(adapters_move, std::abs(in_place[i].first - base[i].first));
  }
  CHECK(adapters_move > 1e-3);
}

TEST_CASE("titan-eval refuses an adapter-only LoRA checkpoint with the command that folds it into its base",
          "[eval][tools][lora][errors][full]") {
  test::TempDir dir;
  Trainer<llama3::Llama3>(lora_run(dir.path / "run", /*adapter_only=*/true)).train();
  const test::ToolRun run = eval_tool(dir.path / "run" / "checkpoint" / "step-3");
  INFO(run.output);
  CHECK(run.code == 1);
  CHECK_THAT(run.output, Catch::Contains("LoRA adapters only") && Catch::Contains("titan-convert to-hf --input STEP"));
}
