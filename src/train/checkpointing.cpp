// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/checkpointing.hpp"

#include <nlohmann/json.hpp>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/checkpointer.hpp"
#include "titan/core/log.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/train/run_context.hpp"
#include "titan/train/training_state.hpp"

#include "preemption_signals.hpp"

namespace titan {

Checkpointing::Checkpointing(const RunContext& run, std::shared_ptr<const checkpoint::HfAdapter> hf)
    : run_(run),
      checkpointer_(std::make_unique<checkpoint::Checkpointer>(
          run.config().checkpoint, run.run_folder(), run.mesh(), std::move(hf),
          static_cast<double>(run.config().comm.train_timeout_seconds),
          // model.tokenizer_path is torchtitan's deprecated spelling of model.hf_assets_path; it wins when set.
          run.config().model.tokenizer_path.value_or(run.config().model.hf_assets_path))) {}

Checkpointing::~Checkpointing() = default;

bool Checkpointing::load(TrainingState& state) {
  checkpoint::State loaded = state.state(/*with_frozen=*/true);
  const auto values = checkpointer_->load(loaded);
  if (!values) return false;
  state.apply(loaded, *values);
  if (state.step > 0) {
    const JobConfig& c = run_.config();
    log::info(
        "Resuming at step {} (global batch {} = local batch {} x {} accumulation steps x data-parallel degree {})",
        state.step + 1, c.training.local_batch_size * run_.grad_accum_steps() * run_.dp_degree(),
        c.training.local_batch_size, run_.grad_accum_steps(), run_.dp_degree());
  }
  if (detail::restart_count() > 0 && run_.mesh().rank() == 0)
    detail::record_restart(run_.run_folder(), state.step + 1, run_.mesh().world_size());
  return true;
}

void Checkpointing::maybe_save(const TrainingState& state, bool stopping) {
  if (checkpointer_->due(state.step, run_.config().training.steps) || stopping) {
    const ProfileScope profile("titan::checkpoint_save");  // staging (and, when not async, writing)
    checkpointer_->save(state.step, state.state(), /*last=*/state.step == run_.config().training.steps);
  }
  // Preempted: the checkpoint is on disk before the process exits, whatever checkpoint.async_mode says.
  if (stopping) checkpointer_->wait();
}

void Checkpointing::wait() { checkpointer_->wait(); }

}  // namespace titan
