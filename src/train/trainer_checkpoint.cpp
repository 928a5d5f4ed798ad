// SPDX-License-Identifier: BSD-3-Clause
// The trainer's side of checkpointing: what its state is, and how a loaded state is applied.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "titan/checkpoint/checkpointer.hpp"
#include "titan/core/log.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/optim/optimizer.hpp"
#include "titan/train/detail/trainer_core.hpp"
#include "titan/train/run_state.hpp"

#include "preemption.hpp"

namespace titan::detail {

checkpoint::State TrainerCore::checkpoint_state() const {
  checkpoint::State state;
  std::vector<std::string> names = model_.parameter_names;
  // A handle without names still checkpoints, under positional keys (stable for one model type).
  for (size_t i = names.size(); i < model_.parameters.size(); ++i) names.push_back(fmt::format("param_{}", i));
  checkpoint::add_model(state, names, model_.parameters, mesh_.get());
  checkpoint::add_optimizer(state, names, *optimizer_, mesh_.get());
  // The MoE expert biases: buffers, not parameters, so a group of their own ("moe.<fqn>"); a checkpoint
  // without it loads as before (its bias stays zero), and HF exports of the model group stay as they were.
  // Each pipeline stage holds (and writes) the biases of its own layers.
  for (const auto& [name, bias] : expert_biases_)
    state.tensors.push_back(checkpoint::state_tensor("moe." + name, bias, mesh_.get(), /*per_stage=*/true));
  // The schedule is a pure function of the step: its state is the step (torch's LambdaLR last_epoch).
  state.values["lr_scheduler"] = {{"last_epoch", step_}};
  // At a step boundary the loader's state is the same on every rank and loads under any dp degree.
  state.values["dataloader"] = loader_->state();
  state.values["train_state"] = {{"step", step_}};
  // What else its numbers depend on: the bf16 GEMM kernel (train/run_state.hpp), compared on resume.
  state.values["train_state"].update(run_state_json(current_run_state(config_, device_)));
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();  // (n,) uint8
  state.tensors.push_back(checkpoint::state_tensor("train_state.rng_cpu", rng, mesh_.get()));
  return state;
}

void TrainerCore::load_checkpoint() {
  checkpointer_ = std::make_unique<checkpoint::Checkpointer>(
      config_.checkpoint, std::filesystem::path(config_.job.dump_folder), *mesh_, model_.hf_adapter,
      static_cast<double>(config_.comm.train_timeout_seconds));
  checkpoint::State state = checkpoint_state();
  const auto values = checkpointer_->load(state);
  if (!values) return;
  apply_state(state, *values);
  if (step_ > 0) {
    log::info(
        "Resuming at step {} (global batch {} = local batch {} x {} accumulation steps x data-parallel degree {})",
        step_ + 1, loader_->global_batch_size(), config_.training.local_batch_size, grad_accum_steps_, dp_degree_);
  }
  if (restart_count() > 0 && mesh_->rank() == 0)
    record_restart(config_.job.dump_folder, step_ + 1, mesh_->world_size());
}

void TrainerCore::apply_state(const checkpoint::State& state, const nlohmann::json& values) {
  for (const auto& st : state.tensors) {
    for (auto& [name, bias] : expert_biases_) {
      if (st.key == "moe." + name && !st.tensor.is_same(bias)) bias.copy_(st.tensor);
    }
  }
  if (values.contains("train_state")) {
    step_ = values.at("train_state").at("step").get<int64_t>();
    if (const auto change = run_state_change(values.at("train_state"), current_run_state(config_, device_)))
      log::warn("{}", *change);
    for (const auto& st : state.tensors) {
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      if (st.key == "train_state.rng_cpu") cpu.set_state(st.tensor);
    }
  }
  if (values.contains("dataloader")) {
    const nlohmann::json& loader = values.at("dataloader");
    loader_->load_state(loader);
    // The sample sequence continues only with the same global batch; the data-parallel degree and the
    // accumulation split may change (an elastic restart on fewer or more ranks).
    const int64_t saved = loader.value("global_batch_size", loader_->global_batch_size());
    if (saved != loader_->global_batch_size()) {
      log::warn(
          "The checkpoint was trained with a global batch of {} sequences; this run's is {} (training.local_batch_size "
          "{} x {} accumulation steps x data-parallel degree {}), so its batches are not the checkpoint's sequence. "
          "Set training.global_batch_size {} to keep it{}.",
          saved, loader_->global_batch_size(), config_.training.local_batch_size, grad_accum_steps_, dp_degree_, saved,
          config_.training.global_batch_size < 0 ? " (unset, it follows the number of ranks)" : "");
    }
  }
}

void TrainerCore::maybe_save_checkpoint() {
  if (checkpointer_->due(step_, config_.training.steps) || stop_signal_ != 0) {
    const ProfileScope profile("titan::checkpoint_save");  // staging (and, when not async, writing)
    checkpointer_->save(step_, checkpoint_state(), /*last=*/step_ == config_.training.steps);
  }
  // Preempted: the checkpoint is on disk before the process exits, whatever checkpoint.async_mode says.
  if (stop_signal_ != 0) checkpointer_->wait();
}

void TrainerCore::wait_for_checkpoint() { checkpointer_->wait(); }

}  // namespace titan::detail
