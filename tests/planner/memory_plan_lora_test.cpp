// SPDX-License-Identifier: BSD-3-Clause
// The planner under model.converters lora: the ranks hold the adapters beside the frozen base, and only the adapters
// get gradients and optimizer state; the plan and titan-plan say how many parameters train. Under lora.quantize_base
// the adapted bases count at NF4's bytes, which the test measures off the quantised module.
#include <fmt/format.h>

#include <regex>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/lora.hpp"
#include "titan/planner/memory_plan.hpp"
#include "titan/quant/qlora.hpp"

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

TEST_CASE("memory plan: a QLoRA job's bases count at NF4's bytes, as many as the converted module holds",
          "[planner][memory_plan][lora][qlora]") {
  JobConfig c;
  titan::apply_preset(c, "llama3_debugmodel");
  c.training.local_batch_size = 1;
  c.model.converters = {"lora"};
  c.lora = {.rank = 8, .alpha = 16, .target_modules = {"attention.wq", "feed_forward.*", "output"}};
  titan::planner::MemoryPlanner planner(c);
  const auto lora = planner.plan(c, {.world_size = 1});
  c.lora.quantize_base = true;
  const auto qlora = planner.plan(c, {.world_size = 1});

  // The module as the Trainer holds it once quantised: its parameters (the bases freed) and the NF4 tensors.
  titan::nn::manual_init_seed(1);
  titan::llama3::Llama3 model(titan::llama3::flavor("debugmodel"), c.training.seq_len, at::TensorOptions());
  titan::nn::add_lora(model, titan::nn::lora_options(c.lora));
  model.init_weights();
  int64_t dense = 0, nf4 = 0;
  for (const auto& [path, linear] : titan::quant::lora_base_linears(model)) dense += linear->weight.nbytes();
  const std::vector<titan::quant::QloraBase> bases = titan::quant::quantize_lora_base(model);
  for (const auto& b : bases) nf4 += b.weight->nbytes();
  const int64_t measured = titan::storage_bytes(model.parameters()) + nf4;
  CHECK(bases.size() == 6 * 4 + 1);  // wq, w1, w2, w3 of 6 blocks, the head
  CHECK(qlora.parts.parameters == measured);
  CHECK(lora.parts.parameters == measured - nf4 + dense);
  // fp32 bases at 0.5 + 1/64 + 4 / (64 x 256) bytes an element, and a mean each.
  CHECK(static_cast<double>(nf4 - 4 * 25) / static_cast<double>(dense / 4) == 0.5 + 1.0 / 64 + 4.0 / (64 * 256));
  // Gradients and optimizer state: the adapters', as LoRA's.
  CHECK(qlora.parts.gradients == lora.parts.gradients);
  CHECK(qlora.parts.optimizer == lora.parts.optimizer);

  const auto bin = titan::test::binary_dir() / "bin" / "titan-plan";
  const auto out = titan::test::binary_dir() / "titan-plan-qlora-test.txt";
  const std::string cmd = fmt::format(
      "'{}' --config llama3_debugmodel --gpus 1 --training.local_batch_size 1 --model.converters lora "
      "--lora.target_modules attention.wq,feed_forward.*,output --lora.quantize_base true > '{}' 2>&1",
      bin.string(), out.string());
  REQUIRE(std::system(cmd.c_str()) == 0);
  CHECK_THAT(titan::test::read_file(out), Contains(fmt::format("({} B)", measured)));
}

}  // namespace memory_plan_lora_test
