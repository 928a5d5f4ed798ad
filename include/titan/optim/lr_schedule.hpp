// SPDX-License-Identifier: BSD-3-Clause
// Warmup-stable-decay learning-rate schedule with torchtitan's exact formula (linear warmup from
// lr/warmup, a virtual +1 step so the LR never reaches zero at the last step, linear|sqrt|cosine
// decay to min_lr_factor * lr).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace titan {

struct LRScheduleConfig {
  /// Linear warmup steps (clamped to the total).
  int64_t warmup_steps = 200;
  /// Total scheduled steps (torchtitan: lr_scheduler.total_steps or training.steps).
  int64_t total_steps = 10000;
  /// Fraction of the total spent decaying; unset = decay right after warmup.
  std::optional<double> decay_ratio = std::nullopt;
  /// linear | sqrt | cosine.
  std::string decay_type = "linear";
  /// Final LR as a fraction of the peak.
  double min_lr_factor = 0.0;
};

class LRSchedule {
 public:
  explicit LRSchedule(LRScheduleConfig config);
  /// Multiplier of the base LR at 0-indexed scheduler step `step` (the step-th optimizer step uses
  /// factor(step - 1): the scheduler advances after each optimizer step, as in torch's LambdaLR).
  double factor(int64_t step) const;

  int64_t warmup_steps() const { return warmup_; }
  int64_t stable_steps() const { return stable_; }
  int64_t decay_steps() const { return decay_; }

 private:
  LRScheduleConfig config_;
  int64_t warmup_;
  int64_t decay_;
  int64_t stable_;
};

}  // namespace titan
