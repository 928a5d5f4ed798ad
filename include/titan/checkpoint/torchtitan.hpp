// SPDX-License-Identifier: BSD-3-Clause
// torchtitan's training state in its DCP checkpoints (checkpoint/dcp.hpp) and titan's (checkpoint.hpp), both ways.
// torchtitan's CheckpointManager saves the model's state dict flattened at the top level ("layers.0.attention.wq.
// weight"), torch's flattened optimizer state dict under "optimizer" ("optimizer.state.<fqn>.exp_avg", ".exp_avg_sq",
// ".step"; "optimizer.param_groups.<fqn>.lr", ...), the LambdaLR state under "lr_scheduler", its trainer's
// {"step", "ntokens_seen"} under "train_state" and its data loader under "dataloader". Parameter names are titan's
// (titan keeps torchtitan's FQNs); what may differ is the order of q/k rows within a head, which the family's
// Hugging Face adapter permutes where torchtitan's model rotates halves as HF does (Qwen3) rather than pairs as
// titan does (Llama 3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/dcp.hpp"
#include "titan/core/config.hpp"

namespace titan::checkpoint {

class HfAdapter;

/// How to read a torchtitan checkpoint of one model.
struct FromTorchtitan {
  std::vector<std::string> params{};  ///< the titan model's parameter FQNs (each must be in the checkpoint)
  const HfAdapter* halves = nullptr;  ///< the family's HF adapter where torchtitan rotates halves; null: as titan
};

/// titan's state of a torchtitan DCP checkpoint: "model.<fqn>", "optimizer.<fqn>.exp_avg|exp_avg_sq|step" (left out,
/// with a log line, when the checkpoint has no optimizer state yet), values lr_scheduler {last_epoch} and
/// train_state {step} with a fresh train_state.rng_cpu (torchtitan saves no RNG state). The data loader's state is
/// torchtitan's own (a pickled StatefulDataLoader of its datasets) and is not carried over: the titan run's loader
/// starts at its beginning. Every tensor is read whole; a key of no known kind is refused by name.
State state_from_torchtitan(const DcpReader& dcp, const FromTorchtitan& how);

/// Writes a state of whole tensors (a converted one) as a titan checkpoint folder of one rank, which loads onto any
/// layout as titan's own checkpoints do.
void write_titan_checkpoint(const std::filesystem::path& folder, const State& state, int64_t step);

/// How to write a titan checkpoint for torchtitan: the optimizer and schedule torchtitan resumes with.
struct ToTorchtitan {
  const HfAdapter* halves = nullptr;  ///< as FromTorchtitan::halves
  bool tied = false;                  ///< the head is the embedding: torchtitan's state dict names it output.weight too
  OptimizerConfig optimizer{};        ///< param_groups' lr, betas, eps, weight_decay, foreach/fused
  double lr_factor = 1;               ///< the schedule's factor at the checkpoint's step (LambdaLR's _last_lr)
  int64_t tokens_per_step = 0;        ///< train_state.ntokens_seen = step x this (torchtitan counts tokens)
};

/// The DCP entries torchtitan's CheckpointManager loads (dataloader excluded) for a titan state of whole tensors and
/// its values (checkpoint::load's): the model, AdamW's state with its param_groups, the LambdaLR state, train_state.
/// LoRA adapters, states of other optimizers (Muon) and the data loader's are refused or left out, by name.
std::vector<DcpEntry> torchtitan_entries(const State& state, const nlohmann::json& values, const ToTorchtitan& how);

}  // namespace titan::checkpoint
