// SPDX-License-Identifier: BSD-3-Clause
// bf16 mixed precision on CPU through the trainer: autocast on one device (training.mixed_precision_param
// = bfloat16) trains close to the fp32 curve, keeps fp32 master weights, gradients and AdamW state, and
// the activation checkpoint's recompute runs under the same CPU autocast as the forward.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "it_trains.hpp"
#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/optim/optimizer.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<double> losses_of(const titan::JobConfig& config) {
  titan::Trainer<titan::llama3::Llama3> trainer(config);
  trainer.train();
  return trainer.core().loss_history();
}

}  // namespace

TEST_CASE("bf16 autocast on CPU trains within 0.01 of the fp32 loss curve over 20 steps",
          "[train][mixed_precision][full]") {
  titan::test::TempDir dir;
  titan::JobConfig config = titan::test::short_precision_job(dir.path / "fp32", 20);
  REQUIRE_FALSE(config.training.mixed_precision_param.has_value());  // unset: fp32 on CPU
  const auto fp32 = losses_of(config);
  config.job.dump_folder = (dir.path / "bf16").string();
  config.training.mixed_precision_param = titan::DType::bfloat16;
  titan::Trainer<titan::llama3::Llama3> trainer(config);
  trainer.train();
  const auto bf16 = trainer.core().loss_history();
  REQUIRE(bf16.size() == fp32.size());
  double max_diff = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    INFO("step " << i + 1 << ": bf16 " << bf16[i] << " fp32 " << fp32[i]);
    max_diff = std::max(max_diff, std::abs(bf16[i] - fp32[i]));
    // bf16 keeps 8 mantissa bits (relative rounding 2^-9 = 0.2%) in every matmul's inputs and output;
    // on losses of 7.6 -> 5 that is a few 1e-3 per step, and the two runs' weights drift apart slowly.
    // Measured max 0.00078 over these 20 steps (2026-12-01); 0.01 leaves a margin on other CPUs.
    CHECK(std::abs(bf16[i] - fp32[i]) <= 0.01);
  }
  WARN("bf16 autocast vs fp32, max |loss difference| over 20 steps: " << max_diff);
  CHECK(bf16 != fp32);  // bf16 really ran
  CHECK_TRAINS(bf16);   // and learned
  // Master weights, gradients and AdamW state stay fp32.
  titan::Optimizer& optimizer = trainer.core().optimizer();
  REQUIRE_FALSE(optimizer.params().empty());
  for (size_t i = 0; i < optimizer.params().size(); ++i) {
    const at::Tensor& p = optimizer.params()[i];
    CHECK(p.scalar_type() == at::kFloat);
    if (p.grad().defined()) CHECK(p.grad().scalar_type() == at::kFloat);
    for (const titan::ParamState& s : optimizer.state(i)) {
      if (s.tensor.is_floating_point() && s.tensor.numel() > 1) CHECK(s.tensor.scalar_type() == at::kFloat);
    }
  }
}

TEST_CASE("bf16 autocast on CPU: full and per-op activation checkpointing give the no-AC losses bitwise",
          "[train][mixed_precision][ac][full]") {
  // Both bf16 GEMM paths (nn/bf16_gemm.hpp), whichever this CPU would choose: per-op AC keeps and replays
  // the widened product through its own backward.
  const titan::nn::Bf16Gemm was = titan::nn::bf16_gemm();
  for (const titan::nn::Bf16Gemm choice : {titan::nn::Bf16Gemm::widened, titan::nn::Bf16Gemm::native}) {
    titan::nn::set_bf16_gemm(choice);
    INFO((choice == titan::nn::Bf16Gemm::widened ? "widened" : "native") << " bf16 GEMMs");
    titan::test::TempDir dir;
    // Two steps: the second step's loss reads weights the first step's recomputed backward moved.
    titan::JobConfig config = titan::test::short_precision_job(dir.path / "none", 2);
    config.training.mixed_precision_param = titan::DType::bfloat16;
    const auto plain = losses_of(config);
    REQUIRE(plain.size() == 2);
    config.activation_checkpoint.mode = titan::AcMode::full;
    config.job.dump_folder = (dir.path / "full").string();
    CHECK(losses_of(config) == plain);  // the recompute ran under CPU autocast too
    config.activation_checkpoint.mode = titan::AcMode::selective;
    config.activation_checkpoint.selective_ac_option = "op";
    config.job.dump_folder = (dir.path / "op").string();
    CHECK(losses_of(config) == plain);
  }
  titan::nn::set_bf16_gemm(was);
}
