// SPDX-License-Identifier: BSD-3-Clause
// The float8 model converter: which Linears of the debug model it converts (torchtitan's filter and
// torchao's auto_filter_small_kn), the config's refusals, and training through the trainer with each
// recipe close to the fp32 loss curve of the same run.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "it_trains.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/core/error.hpp"
#include "titan/float8/converter.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace f8 = titan::float8;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

std::unique_ptr<titan::llama3::Llama3> debug_model() {
  titan::nn::manual_init_seed(42);
  auto model =
      std::make_unique<titan::llama3::Llama3>(titan::llama3::flavor("debugmodel"), /*seq_len=*/32, at::TensorOptions());
  model->init_weights();
  return model;
}

}  // namespace

TEST_CASE("float8 converter: every block Linear of the debug model converts and a filtered output is reported",
          "[cpu][float8][converter]") {
  auto model = debug_model();
  const at::Tensor tokens = at::randint(2048, {2, 32}, at::kLong);
  const at::Tensor before = model->forward(tokens);
  const f8::Float8Conversion report =
      f8::convert_to_float8(*model, {.config = {.recipe = f8::Recipe::kTensorwise}, .filter_fqns = {"output"}});
  CHECK(report.converted.size() == 6 * 7);  // wq wk wv wo w1 w2 w3 in each of 6 blocks
  CHECK(std::find(report.converted.begin(), report.converted.end(), "layers.0.attention.wq") != report.converted.end());
  CHECK(std::find(report.converted.begin(), report.converted.end(), "layers.5.feed_forward.w2") !=
        report.converted.end());
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].first == "output");
  CHECK_THAT(report.skipped[0].second, Contains("filter_fqns entry \"output\""));
  const at::Tensor after = model->forward(tokens);
  CHECK_FALSE(at::equal(after, before));  // the converted Linears compute in float8 now
  const double rel = ((after - before).norm() / before.norm()).item<double>();
  CHECK(rel < 0.1);
}

TEST_CASE("float8 converter: auto_filter_small_kn applies torchao's thresholds per recipe",
          "[cpu][float8][converter]") {
  {
    auto model = debug_model();
    // tensorwise skips K <= 4096 and N <= 1024: the blocks' (N <= 768); the output head (N 2048) converts.
    const auto report = f8::convert_to_float8(*model, {.filter_fqns = {"auto_filter_small_kn"}});
    CHECK(report.converted == std::vector<std::string>{"output"});
    CHECK(report.skipped.size() == 42);
    CHECK_THAT(report.skipped[0].second, Contains("auto_filter_small_kn"));
  }
  {
    auto model = debug_model();
    const auto report = f8::convert_to_float8(
        *model, {.config = {.recipe = f8::Recipe::kRowwise}, .filter_fqns = {"auto_filter_small_kn"}});
    CHECK(report.converted.empty());  // rowwise skips N <= 2048
  }
  CHECK_THROWS_WITH(f8::small_gemm_skip_reason(f8::Recipe::kRowwiseWithGwHp, 4096, 4096),
                    Contains("no size thresholds"));
}

TEST_CASE("float8 config: a rowwise recipe with float8 all-gather and an unknown converter are errors naming the key",
          "[cpu][float8][config]") {
  titan::JobConfig c;
  c.model.converters = {"quantize.linear.float8"};
  c.float8.recipe_name = titan::Float8Recipe::rowwise;
  c.float8.enable_fsdp_float8_all_gather = true;
  CHECK_THROWS_AS(titan::validate(c), titan::ConfigError);
  CHECK_THROWS_WITH(titan::validate(c), Contains("float8.enable_fsdp_float8_all_gather") && Contains("rowwise"));
  c.float8.recipe_name = titan::Float8Recipe::tensorwise;
  CHECK_NOTHROW(titan::validate(c));
  c.float8.precompute_float8_dynamic_scale_for_fsdp = true;
  CHECK(titan::unsupported_notes(c).empty());  // float8 all-gather and precomputed scales work: no note
  c.float8.enable_fsdp_float8_all_gather = false;

  c.model.converters = {"flaot8"};
  CHECK_THROWS_WITH(titan::validate(c), Contains("model.converters") && Contains("flaot8"));
  c.model.converters = {"float8"};
  c.float8.recipe_name = titan::Float8Recipe::rowwise_with_gw_hp;
  c.float8.filter_fqns = {"auto_filter_small_kn"};
  CHECK_THROWS_WITH(titan::validate(c), Contains("auto_filter_small_kn") && Contains("rowwise_with_gw_hp"));
}

TEST_CASE("float8 training: the debug model with each recipe stays within 0.02 of the fp32 loss curve",
          "[train][float8][converter][full]") {
  titan::test::TempDir dir;
  constexpr int64_t kSteps = 20;
  titan::JobConfig config = titan::test::short_precision_job(dir.path / "fp32", kSteps);
  titan::Trainer<titan::llama3::Llama3> reference(config);
  reference.train();
  const auto fp32 = reference.core().loss_history();
  CHECK(reference.rank_model().float8_converted().empty());
  for (const auto recipe :
       {titan::Float8Recipe::tensorwise, titan::Float8Recipe::rowwise, titan::Float8Recipe::rowwise_with_gw_hp}) {
    for (const bool emulate : {false, true}) {
      if (emulate && recipe != titan::Float8Recipe::tensorwise) continue;  // rowwise is emulated on CPU anyway
      const std::string name = fmt::format("{}{}", titan::choice_name(recipe), emulate ? "_emulated" : "");
      INFO("recipe " << name);
      config.job.dump_folder = (dir.path / name).string();
      config.model.converters = {"float8"};
      config.float8.recipe_name = recipe;
      config.float8.emulate = emulate;
      config.float8.filter_fqns = {"output"};
      titan::Trainer<titan::llama3::Llama3> trainer(config);
      CHECK(trainer.rank_model().float8_converted().size() == 42);
      trainer.train();
      const auto f8_losses = trainer.core().loss_history();
      REQUIRE(f8_losses.size() == fp32.size());
      double max_diff = 0;
      for (size_t i = 0; i < fp32.size(); ++i) max_diff = std::max(max_diff, std::abs(f8_losses[i] - fp32[i]));
      WARN(name << " vs fp32, max |loss difference| over " << kSteps << " steps: " << max_diff);
      // float8 rounds each GEMM operand to 3 (e4m3) or 2 (e5m2) mantissa bits after scaling: a few %
      // relative error per GEMM (docs/float8.md). Measured max over the 20 steps (2026-12-01): tensorwise
      // 0.0053 (emulated the same to 3e-6), rowwise 0.0031, rowwise_with_gw_hp 0.0026; 0.02 leaves 4x.
      CHECK(max_diff <= 0.02);
      CHECK(f8_losses != fp32);
      CHECK_TRAINS(f8_losses);
    }
  }
}
