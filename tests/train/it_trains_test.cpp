// SPDX-License-Identifier: BSD-3-Clause
// The "it trains" check of every test that claims a run learned (tests/it_trains.hpp) against what it must
// tell apart: batch noise alone (Gaussian draws, and a real run of the trainer at lr 0) fails it, a descent
// well above the noise passes.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "it_trains.hpp"
#include "test_util.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

TEST_CASE(
    "it trains: batch noise alone passes less than once in 1,000 runs, a descent of 20 noise sigmas mostly passes",
    "[train][it_trains]") {
  const at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/7);
  constexpr int64_t kRuns = 20000;
  for (const int64_t n : {6, 8, 10, 20, 200}) {
    // lr 0: each step's loss one independent draw of the batch noise (its size cancels out of the check).
    const at::Tensor noise = at::randn({kRuns, n}, gen, at::kDouble);  // (runs, steps)
    const auto draws = noise.accessor<double, 2>();
    int64_t noise_passed = 0;
    int64_t descent_passed = 0;
    for (int64_t r = 0; r < kRuns; ++r) {
      std::vector<double> losses(static_cast<size_t>(n));
      std::vector<double> falling(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        losses[static_cast<size_t>(i)] = draws[r][i];
        // A steady descent of 20 noise sigmas over the run.
        falling[static_cast<size_t>(i)] = draws[r][i] - 20.0 * static_cast<double>(i) / static_cast<double>(n - 1);
      }
      noise_passed += titan::test::descent(losses).trained() ? 1 : 0;
      descent_passed += titan::test::descent(falling).trained() ? 1 : 0;
    }
    INFO(n << " steps: noise passed " << noise_passed << " of " << kRuns << ", a descent of 20 sigmas "
           << descent_passed);
    CHECK(noise_passed < kRuns / 1000);
    CHECK(descent_passed > kRuns * 8 / 10);
  }
  // A real curve that learns (the golden curve's first 8 steps) passes; the same curve held flat fails.
  const std::vector<double> golden = {8.208941, 8.111366, 7.902037, 7.731213, 7.841128, 7.679595, 7.214886, 6.651472};
  CHECK(titan::test::descent(golden).trained());
  CHECK_FALSE(titan::test::descent(std::vector<double>(8, 8.2)).trained());
}

TEST_CASE("it trains: the trainer at lr 0 fails the check, within the batch noise", "[train][it_trains][full]") {
  titan::test::TempDir dir;
  // The precision tests' job (tests/train/train_test_util.hpp), the shortest run the check can pass.
  titan::JobConfig config = titan::test::short_precision_job(dir.path, /*steps=*/6);
  config.optimizer.lr = 0;
  titan::Trainer<titan::llama3::Llama3> trainer(config);
  trainer.train();
  const std::vector<double> losses = trainer.core().loss_history();
  REQUIRE(losses.size() == 6);
  CHECK(losses != std::vector<double>(6, losses.front()));  // each step saw another batch
  const titan::test::Descent d = titan::test::descent(losses);
  INFO(d.describe());
  CHECK_FALSE(d.trained());
  CHECK(std::abs(d.first - d.last) < d.bound);  // not trained either way: noise
}
