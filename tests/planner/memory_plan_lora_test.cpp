// SPDX-License-Identifier: BSD-3-Clause
// The planner under model.converters lora: the ranks hold the adapters beside the frozen base, and only the adapters
// get gradients and optimizer state; the plan and titan-plan say how many parameters train.
#include <fmt/format.h>

#include <regex>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/planner/memory_plan.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace memory_plan_lora_test {

using Catch::Matchers::Contains;
using titan::JobConfig;

TEST_CASE("memory plan: a LoRA job keeps gradients and optimizer state for its adapters only",
          "[planner][memory_plan][lora]") {
  JobConfig c;
  titan::apply_preset(c, "llama3_8b");
  c.training.local_batch_size = 1;
  titan::planner::MemoryPlanner planner(c);
  const auto base = planner.plan(c, {.world_size = 8});
  c.model.converters = {"lora"};
  c.lora = {.rank = 16, .target_modules = {"wq", "wv"}};
  const auto lora = planner.plan(c, {.world_size = 8});
  // D 4096, 32 blocks, kv dim 1024: per block wq's A (16, 4096) and B (4096, 16), wv's A (16, 4096) and B (1024, 16).
  const int64_t adapters = 32 * 16 * (4096 + 4096 + 4096 + 1024);
  CHECK(lora.trainable_params == adapters);
  CHECK(lora.params == base.params + adapters);
  CHECK(base.trainable_params == base.params);
  // fp32 over 8 FSDP shards (16 rows split 2 each: no padding).
  CHECK(lora.parts.parameters == base.parts.parameters + adapters * 4 / 8);
  CHECK(lora.parts.gradients == adapters * 4 / 8);
  CHECK(lora.parts.optimizer == 2 * adapters * 4 / 8 + 4 * (32 * 4));  // exp_avg, exp_avg_sq + a step per tensor
  CHECK_THAT(titan::planner::format_plan(lora),
             Contains(fmt::format("trainable     {} of {} parameters", adapters, base.params + adapters)));
  CHECK_THAT(titan::planner::format_plan(base), !Contains("trainable"));

  const auto bin = titan::test::binary_dir() / "bin" / "titan-plan";
  const auto out = titan::test::binary_dir() / "titan-plan-lora-test.txt";
  const std::string cmd = fmt::format(
      "'{}' --config llama3_8b --gpus 8 --model.converters lora --lora.rank 16 --lora.target_modules wq,wv > '{}' 2>&1",
      bin.string(), out.string());
  REQUIRE(std::system(cmd.c_str()) == 0);
  CHECK_THAT(titan::test::read_file(out), Contains(fmt::format("trainable     {} of", adapters)) &&
                                              Contains(fmt::format("({} B)", 2 * adapters * 4 / 8 + 4 * (32 * 4))));
}

}  // namespace memory_plan_lora_test
