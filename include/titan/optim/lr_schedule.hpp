// SPDX-License-Identifier: BSD-3-Clause
// Warmup-stable-decay learning-rate schedule with torchtitan's exact formula (linear warmup from
// lr/warmup, a virtual +1 step so the LR never reaches zero at the last step, linear|sqrt|cosine
// decay to min_lr_factor * lr), configured by the [lr_scheduler] section (core/config.hpp).
#pragma once

#include "titan/core/config.hpp"

#include <cstdint>

namespace titan {

class LRSchedule {
 public:
  /// The schedule spans config.total_steps, or `training_steps` (training.steps) when that is unset.
  LRSchedule(const LRSchedulerConfig& config, int64_t training_steps);
  /// Multiplier of the base LR at 0-indexed scheduler step `step` (the step-th optimizer step uses
  /// factor(step - 1): the scheduler advances after each optimizer step, as in torch's LambdaLR).
  double factor(int64_t step) const;

  int64_t total_steps() const { return total_; }
  int64_t warmup_steps() const { return warmup_; }
  int64_t stable_steps() const { return stable_; }
  int64_t decay_steps() const { return decay_; }

 private:
  DecayType decay_type_;
  double min_lr_factor_;
  int64_t total_;
  int64_t warmup_;
  int64_t decay_;
  int64_t stable_;
};

}  // namespace titan
