// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/preemption.hpp"

#include "titan/core/config.hpp"
#include "titan/train/run_context.hpp"

#include "preemption_signals.hpp"

namespace titan {

Preemption::Preemption(const RunContext& run) : run_(run) {
  // Preemption saves a checkpoint, so it is armed only when this run saves them.
  const CheckpointConfig& ckpt = run.config().checkpoint;
  if (ckpt.enable && !ckpt.load_only && !ckpt.create_seed_checkpoint && !ckpt.preemption_signals.empty())
    signals_ = std::make_unique<detail::PreemptionSignals>(ckpt.preemption_signals);
}

Preemption::~Preemption() = default;

int Preemption::stop_signal() const {
  if (!signals_) return 0;
  // Ranks see the signal at different moments; the largest signal number over the world decides, so every rank
  // stops after the same step.
  return static_cast<int>(run_.all_reduce_max(detail::PreemptionSignals::received(), "world"));
}

std::string Preemption::signal_name(int signal) { return detail::signal_name(signal); }

}  // namespace titan
