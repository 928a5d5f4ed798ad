// SPDX-License-Identifier: BSD-3-Clause
// Checkpointing: the checkpoint.* policy applied to a TrainingState: load the run's latest checkpoint (or
// checkpoint.initial_load_path) at start, save on checkpoint.interval, the last step and preemption, wait for an
// async save before exit. The checkpoint format and its resharding are checkpoint/; this is when and what.
//
//   titan::Checkpointing checkpoints(run, model->hf_adapter());
//   checkpoints.load(state);                     // a resumed run continues at state.step + 1
//   ... each step: checkpoints.maybe_save(state, /*stopping=*/preempted);
#pragma once

#include <memory>

namespace titan {
class RunContext;
class TrainingState;
namespace checkpoint {
class Checkpointer;
class HfAdapter;
}  // namespace checkpoint

class Checkpointing {
 public:
  /// Checkpoints under <job.dump_folder>/<checkpoint.folder>; `hf` (may be null) for Hugging Face import/export.
  Checkpointing(const RunContext& run, std::shared_ptr<const checkpoint::HfAdapter> hf);
  ~Checkpointing();
  Checkpointing(const Checkpointing&) = delete;
  Checkpointing& operator=(const Checkpointing&) = delete;

  /// Loads into `state` what checkpoint.* says (the latest step of this run, else initial weights); false when there
  /// was nothing to load. A restarted process (titan-run --max-restarts) records its restart.
  bool load(TrainingState& state);
  /// Saves `state` when state.step is a save step, or when the run is `stopping` (a preemption signal): then it also
  /// waits for the write, whatever checkpoint.async_mode says.
  void maybe_save(const TrainingState& state, bool stopping);
  /// Waits for an in-flight async save (call before the process exits).
  void wait();

 private:
  const RunContext& run_;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
};

}  // namespace titan
