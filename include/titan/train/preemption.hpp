// SPDX-License-Identifier: BSD-3-Clause
// Preemption: checkpoint.preemption_signals (SIGTERM, SIGUSR1, ... as a scheduler sends them before it takes the
// machine back) make every rank save a checkpoint at the end of the current step and stop; the same command resumes.
// Armed only when the run saves checkpoints. Ranks see a signal at different moments, so after each step they
// agree on one: a small all-reduce, only while armed.
//
//   titan::Preemption preemption(run);
//   ... after each step: if (preemption.stop_signal() != 0) { save; stop; }
#pragma once

#include <memory>
#include <string>

namespace titan {
class RunContext;
namespace detail {
class PreemptionSignals;
}

class Preemption {
 public:
  explicit Preemption(const RunContext& run);
  ~Preemption();
  Preemption(const Preemption&) = delete;
  Preemption& operator=(const Preemption&) = delete;

  /// Whether signals are armed (checkpointing on and checkpoint.preemption_signals non-empty).
  bool armed() const { return signals_ != nullptr; }
  /// The signal every rank agreed to stop on after this step (the largest received over the world), 0 to go on.
  /// Collective over the world when armed; 0 without an all-reduce otherwise.
  int stop_signal() const;
  /// "SIGTERM" for 15.
  static std::string signal_name(int signal);

 private:
  const RunContext& run_;
  std::unique_ptr<detail::PreemptionSignals> signals_;
};

}  // namespace titan
