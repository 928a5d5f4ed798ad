// SPDX-License-Identifier: BSD-3-Clause
// LoRA through the bundled trainer (build/bin/train under titan-run, ranks as processes) on the layouts the
// in-process parity tests (tests/parallel/lora_parity_test.cpp: FSDP 2 x TP 2) do not split: pipeline parallelism,
// where each stage converts its own part of the model (1F1B over the rank's microbatches), and expert parallelism on
// Qwen3-MoE, whose routed experts get no adapters and stay frozen, split over ep. Each run's losses follow one
// process's.
//
// Tolerance, 1e-5 relative per step: the ranks sum the same fp32 terms in another order (microbatch gradients
// accumulated per stage, all-to-all'd expert slots, reduce-scatters), ~1e-7 relative a reduction; over 6 AdamW
// steps of the adapters that stays well below 1e-5, while a stage that converted the wrong part of the model, an
// adapter left untrained or a frozen weight stepped moves the loss by 1e-3 or more from step 2.
#include <nlohmann/json.hpp>

#include <map>
#include <sstream>

#include "dist/launch_test_util.hpp"
#include "test_util.hpp"

namespace lora_layouts_test {

using namespace titan;
using namespace titan::test;

constexpr int64_t kSteps = 6;
constexpr int64_t kGlobalBatch = 4;  // sequences a step, split over the dp ranks

struct Layout {
  int64_t ranks = 1;                   // processes
  int64_t dp = 1;                      // of them, the data-parallel degree
  std::vector<std::string> degrees{};  // parallelism flags
};

// step -> the logged global loss.
std::map<int64_t, double> lora_losses(const std::string& model, const std::string& flavor, const Layout& layout) {
  TempDir dump;
  std::vector<std::string> args;
  if (layout.ranks > 1) args = {titan_run_path(), "--nproc-per-node", std::to_string(layout.ranks), "--"};
  args = concat(args, debug_job("train", dump.path, kSteps, kGlobalBatch / layout.dp));
  args = concat(args, {"--model.name", model, "--model.flavor", flavor, "--model.converters", "lora", "--lora.rank",
                       "4", "--lora.alpha", "16", "--optimizer.lr", "1e-2", "--activation_checkpoint.mode", "none"});
  args = concat(args, layout.degrees);
  Subprocess p =
      layout.ranks > 1 ? Subprocess(args) : Subprocess(args, {{"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}});
  require_exit(p, 0, 300);
  INFO(p.output());
  CHECK_THAT(p.output(), Catch::Contains("Trainable parameters:") && Catch::Contains("LoRA adapters"));
  std::map<int64_t, double> out;
  std::istringstream in(read_file(dump.path / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss_metrics/global_avg_loss"))
      out[j.at("step").get<int64_t>()] = j.at("loss_metrics/global_avg_loss").get<double>();
  }
  REQUIRE(static_cast<int64_t>(out.size()) == kSteps);
  return out;
}

void check_against_one_process(const std::string& model, const std::string& flavor, const Layout& layout) {
  const auto one = lora_losses(model, flavor, {});
  const auto split = lora_losses(model, flavor, layout);
  // The adapters train: the loss moves over the run by far more than the tolerance.
  CHECK(std::abs(one.at(kSteps) - one.at(1)) > 1e-2);
  for (int64_t step = 1; step <= kSteps; ++step) {
    INFO("step " << step);
    CHECK(split.at(step) == Approx(one.at(step)).epsilon(1e-5));
  }
}

}  // namespace lora_layouts_test

using namespace lora_layouts_test;

TEST_CASE("LoRA through the trainer under PP 2 (each stage its part) follows one process", "[train][lora][pp][full]") {
  check_against_one_process("llama3", "debugmodel",
                            {.ranks = 2, .dp = 1, .degrees = {"--parallelism.pipeline_parallel_degree", "2"}});
}

TEST_CASE("LoRA on Qwen3-MoE through the trainer under EP 2 (routed experts frozen) follows one process",
          "[train][lora][ep][full]") {
  check_against_one_process(
      "qwen3", "tiny_moe",
      {.ranks = 2,
       .dp = 2,
       .degrees = {"--parallelism.data_parallel_shard_degree", "2", "--parallelism.expert_parallel_degree", "2"}});
}
