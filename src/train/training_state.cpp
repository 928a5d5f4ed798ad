// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/training_state.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/core/config.hpp"
#include "titan/core/log.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/train/semi_sync.hpp"

namespace titan {

TrainingState::TrainingState(Parts parts) : parts_(std::move(parts)) {
  // A state without names still checkpoints, under positional keys (stable for one model type).
  for (size_t i = parts_.names.size(); i < parts_.parameters.size(); ++i)
    parts_.names.push_back(fmt::format("param_{}", i));
}

checkpoint::State TrainingState::state(bool with_frozen) const {
  checkpoint::State state;
  const LoraConfig* lora = parts_.lora;
  // LoRA's adapters are a group of their own: a base checkpoint (no such group) loads under them, and an
  // adapter-only one (no model group) beside the base weights of checkpoint.initial_load_path.
  checkpoint::add_model(state, parts_.names, parts_.parameters, parts_.mesh, lora != nullptr ? "lora" : "model");
  if (lora == nullptr || !lora->save_adapter_only || with_frozen)
    checkpoint::add_model(state, parts_.frozen_names, parts_.frozen, parts_.mesh);
  if (lora != nullptr) {
    state.values["lora"] = {{"rank", lora->rank},
                            {"alpha", lora->alpha},
                            {"dropout", lora->dropout},
                            {"target_modules", lora->target_modules},
                            {"merge_adapter", lora->merge_adapter}};
    // A QLoRA run's adapters trained on the NF4 round trip of the base in the training dtype: what a merge rebuilds.
    if (lora->quantize_base && !parts_.parameters.empty()) {
      state.values["lora"]["quantize_base"] = true;
      state.values["lora"]["nf4_dtype"] =
          parts_.parameters.front().scalar_type() == at::kFloat ? "float32" : "bfloat16";
    }
  }
  if (parts_.optimizer != nullptr) checkpoint::add_optimizer(state, parts_.names, *parts_.optimizer, parts_.mesh);
  if (parts_.semi_sync != nullptr) parts_.semi_sync->add_state(state, parts_.names, parts_.mesh);
  for (size_t i = 0; i < parts_.parameters.size(); ++i) {
    const at::Tensor& p = parts_.parameters[i];
    if (std::none_of(parts_.copies.begin(), parts_.copies.end(), [&](const at::Tensor& c) { return c.is_same(p); }))
      continue;
    // The copy's weight, optimizer and outer-step state equal the original's, which the first stage's ranks write.
    const std::string& name = parts_.names[i];
    for (checkpoint::StateTensor& t : state.tensors) {
      if (t.key == "model." + name || t.key.starts_with("optimizer." + name + ".") ||
          t.key.starts_with("semi_sync." + name + "."))
        t.owner = false;
    }
  }
  // The MoE expert biases: buffers, not parameters, so a group of their own ("moe.<fqn>"); a checkpoint
  // without it loads as before (its bias stays zero), and HF exports of the model group stay as they were.
  // Each pipeline stage holds (and writes) the biases of its own layers.
  for (const auto& [name, bias] : parts_.expert_biases)
    state.tensors.push_back(checkpoint::state_tensor("moe." + name, bias, parts_.mesh, /*per_stage=*/true));
  // The schedule is a pure function of the step: its state is the step (torch's LambdaLR last_epoch).
  state.values["lr_scheduler"] = {{"last_epoch", step}};
  // At a step boundary the loader's state is the same on every rank and loads under any dp degree.
  if (parts_.loader != nullptr) state.values["dataloader"] = parts_.loader->state();
  state.values["train_state"] = {{"step", step}};
  // What else its numbers depend on: the bf16 GEMM kernel (train/run_state.hpp), compared on resume.
  state.values["train_state"].update(run_state_json(parts_.run_state));
  const at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();  // (n,) uint8
  state.tensors.push_back(checkpoint::state_tensor("train_state.rng_cpu", rng, parts_.mesh));
  return state;
}

void TrainingState::apply(const checkpoint::State& state, const nlohmann::json& values) {
  for (const auto& st : state.tensors) {
    for (auto& [name, bias] : parts_.expert_biases) {
      if (st.key == "moe." + name && !st.tensor.is_same(bias)) bias.copy_(st.tensor);
    }
  }
  // Loaded in place with the other tensors; a checkpoint without them starts from its parameters (SemiSync::start).
  if (values.contains("semi_sync") && parts_.semi_sync != nullptr) parts_.semi_sync->restored();
  if (values.contains("train_state")) {
    step = values.at("train_state").at("step").get<int64_t>();
    if (const auto change = run_state_change(values.at("train_state"), parts_.run_state)) log::warn("{}", *change);
    for (const auto& st : state.tensors) {
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      if (st.key == "train_state.rng_cpu") cpu.set_state(st.tensor);
    }
  }
  if (values.contains("dataloader") && parts_.loader != nullptr) {
    const nlohmann::json& loader = values.at("dataloader");
    parts_.loader->load_state(loader);
    // The sample sequence continues only with the same global batch; the data-parallel degree and the
    // accumulation split may change (an elastic restart on fewer or more ranks).
    const int64_t saved = loader.value("global_batch_size", parts_.loader->global_batch_size());
    if (saved != parts_.loader->global_batch_size()) {
      log::warn(
          "The checkpoint was trained with a global batch of {} sequences; this run's is {} (training.local_batch_size "
          "x gradient accumulation steps x data-parallel degree), so its batches are not the checkpoint's sequence. "
          "Set training.global_batch_size {} to keep it.",
          saved, parts_.loader->global_batch_size(), saved);
    }
  }
}

}  // namespace titan
