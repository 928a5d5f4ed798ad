// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "titan/core/error.hpp"

namespace titan {

LRSchedule::LRSchedule(LRScheduleConfig config) : config_(std::move(config)) {
  const auto& c = config_;
  TITAN_CHECK_VALUE(c.total_steps > 0, "[titan::LRSchedule] expected lr_scheduler.total_steps > 0, got {}.",
                    c.total_steps);
  TITAN_CHECK_VALUE(c.warmup_steps >= 0, "[titan::LRSchedule] expected lr_scheduler.warmup_steps >= 0, got {}.",
                    c.warmup_steps);
  TITAN_CHECK_VALUE(c.decay_type == "linear" || c.decay_type == "sqrt" || c.decay_type == "cosine",
                    "[titan::LRSchedule] expected lr_scheduler.decay_type in linear|sqrt|cosine, got '{}'.",
                    c.decay_type);
  TITAN_CHECK_VALUE(c.min_lr_factor >= 0.0 && c.min_lr_factor <= 1.0,
                    "[titan::LRSchedule] expected lr_scheduler.min_lr_factor in [0, 1], got {}.", c.min_lr_factor);
  warmup_ = std::min(c.warmup_steps, c.total_steps);
  if (c.decay_ratio) {
    TITAN_CHECK_VALUE(*c.decay_ratio >= 0.0 && *c.decay_ratio <= 1.0,
                      "[titan::LRSchedule] expected lr_scheduler.decay_ratio in [0, 1], got {}.", *c.decay_ratio);
    decay_ = static_cast<int64_t>(std::nearbyint(static_cast<double>(c.total_steps) * *c.decay_ratio));
    decay_ = std::min(decay_, c.total_steps - warmup_);
  } else {
    decay_ = c.total_steps - warmup_;
  }
  // The +1 is torchtitan's virtual step: the final real step still trains with a non-zero LR.
  stable_ = c.total_steps + 1 - warmup_ - decay_;
}

double LRSchedule::factor(int64_t step) const {
  if (step < warmup_) return static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step < warmup_ + stable_) return 1.0;
  const double progress =
      static_cast<double>(step + 1 - warmup_ - stable_) / static_cast<double>(std::max<int64_t>(decay_, 1));
  double f = 0.0;
  if (config_.decay_type == "linear") {
    f = 1.0 - progress;
  } else if (config_.decay_type == "sqrt") {
    f = 1.0 - std::sqrt(progress);
  } else {
    f = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  return config_.min_lr_factor + (1.0 - config_.min_lr_factor) * f;
}

}  // namespace titan
