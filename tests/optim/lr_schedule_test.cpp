// SPDX-License-Identifier: BSD-3-Clause
// Warmup-stable-decay: values at chosen steps as torchtitan's linear_warmup_stable_decay gives them
// (derived by hand from its formula, reference/torchtitan.md §9.2, in the comments).
#include "titan/optim/lr_schedule.hpp"
#include "test_util.hpp"

using titan::DecayType;
using titan::LRSchedule;

TEST_CASE("lr schedule: torchtitan debug job (warmup 2, decay_ratio 0.8, 10 steps, linear)", "[optim][lr]") {
  const LRSchedule s({.warmup_steps = 2, .decay_ratio = 0.8, .decay_type = DecayType::linear}, /*training_steps=*/10);
  // total_steps unset: training.steps. warmup 2, decay round(8) = 8, stable = 10 + 1 - 2 - 8 = 1.
  CHECK(s.total_steps() == 10);
  CHECK(s.warmup_steps() == 2);
  CHECK(s.decay_steps() == 8);
  CHECK(s.stable_steps() == 1);
  const double expected[] = {0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125};
  for (int64_t step = 0; step < 10; ++step) {
    INFO("scheduler step " << step);
    CHECK(s.factor(step) == Approx(expected[step]).margin(1e-12));
  }
}

TEST_CASE("lr schedule: decay right after warmup, min_lr_factor, sqrt and cosine", "[optim][lr]") {
  // decay_ratio unset: decay = total - warmup = 6, stable = 1 (the virtual step).
  const LRSchedule lin({.warmup_steps = 4, .total_steps = 10, .min_lr_factor = 0.1}, 1000);
  CHECK(lin.factor(0) == Approx(0.25));
  CHECK(lin.factor(3) == Approx(1.0));
  CHECK(lin.factor(4) == Approx(1.0));  // the stable virtual step
  // step 5: p = (6 - 4 - 1) / 6 = 1/6 -> 0.1 + 0.9 * 5/6 = 0.85
  CHECK(lin.factor(5) == Approx(0.85));
  // last step 9: p = 5/6 -> 0.1 + 0.9/6 = 0.25 (never reaches the floor at the final step)
  CHECK(lin.factor(9) == Approx(0.25));

  const LRSchedule sq({.warmup_steps = 0, .total_steps = 4, .decay_type = DecayType::sqrt}, 1000);
  // warmup 0, decay 4, stable 1: step 0 -> 1; step 1: p = 1/4 -> 1 - 0.5.
  CHECK(sq.factor(0) == Approx(1.0));
  CHECK(sq.factor(1) == Approx(0.5));

  const LRSchedule cos({.warmup_steps = 0, .total_steps = 4, .decay_type = DecayType::cosine}, 1000);
  // step 2: p = 2/4 -> 0.5 * (1 + cos(pi/2)) = 0.5
  CHECK(cos.factor(2) == Approx(0.5));
  CHECK(cos.factor(1) == Approx(0.5 * (1 + std::cos(3.141592653589793 / 4))));
}

TEST_CASE("lr schedule: edge cases match torchtitan", "[optim][lr]") {
  // warmup longer than training: clamped to the total, decay 0, stable 1.
  const LRSchedule w({.warmup_steps = 20, .total_steps = 5}, 1000);
  CHECK(w.warmup_steps() == 5);
  CHECK(w.factor(0) == Approx(0.2));
  CHECK(w.factor(4) == Approx(1.0));
  // Python's round() is half-to-even: 10 * 0.25 = 2.5 -> 2 decay steps.
  const LRSchedule r({.warmup_steps = 1, .total_steps = 10, .decay_ratio = 0.25}, 1000);
  CHECK(r.decay_steps() == 2);
  CHECK(r.stable_steps() == 8);
  CHECK_THROWS_WITH(LRSchedule({.min_lr_factor = 2.0}, 10), Catch::Contains("lr_scheduler.min_lr_factor"));
  CHECK_THROWS_WITH(LRSchedule({}, 0), Catch::Contains("training.steps"));
}
