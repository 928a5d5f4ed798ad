// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "titan/core/error.hpp"

namespace titan {

LRSchedule::LRSchedule(const LRSchedulerConfig& c, int64_t training_steps)
    : decay_type_(c.decay_type), min_lr_factor_(c.min_lr_factor), total_(c.total_steps.value_or(training_steps)) {
  TITAN_CHECK_VALUE(total_ > 0,
                    "[titan::LRSchedule] expected lr_scheduler.total_steps (or training.steps) > 0, got {}.", total_);
  TITAN_CHECK_VALUE(c.warmup_steps >= 0, "[titan::LRSchedule] expected lr_scheduler.warmup_steps >= 0, got {}.",
                    c.warmup_steps);
  TITAN_CHECK_VALUE(c.min_lr_factor >= 0.0 && c.min_lr_factor <= 1.0,
                    "[titan::LRSchedule] expected lr_scheduler.min_lr_factor in [0, 1], got {}.", c.min_lr_factor);
  warmup_ = std::min(c.warmup_steps, total_);
  if (c.decay_ratio) {
    TITAN_CHECK_VALUE(*c.decay_ratio >= 0.0 && *c.decay_ratio <= 1.0,
                      "[titan::LRSchedule] expected lr_scheduler.decay_ratio in [0, 1], got {}.", *c.decay_ratio);
    decay_ = static_cast<int64_t>(std::nearbyint(static_cast<double>(total_) * *c.decay_ratio));
    decay_ = std::min(decay_, total_ - warmup_);
  } else {
    decay_ = total_ - warmup_;
  }
  // The +1 is torchtitan's virtual step: the final real step still trains with a non-zero LR.
  stable_ = total_ + 1 - warmup_ - decay_;
}

double LRSchedule::factor(int64_t step) const {
  if (step < warmup_) return static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step < warmup_ + stable_) return 1.0;
  const double progress =
      static_cast<double>(step + 1 - warmup_ - stable_) / static_cast<double>(std::max<int64_t>(decay_, 1));
  double f = 0.0;
  switch (decay_type_) {
    case DecayType::linear:
      f = 1.0 - progress;
      break;
    case DecayType::sqrt:
      f = 1.0 - std::sqrt(progress);
      break;
    case DecayType::cosine:
      f = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      break;
  }
  return min_lr_factor_ + (1.0 - min_lr_factor_) * f;
}

}  // namespace titan
