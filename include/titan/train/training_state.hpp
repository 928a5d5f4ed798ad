// SPDX-License-Identifier: BSD-3-Clause
// TrainingState: everything a training run's checkpoint holds, in one place: the model's parameters, the
// optimizer's state, the LR schedule (its step), the data loader's position, the CPU RNG and the MoE layers'
// expert biases, under torchtitan's group names (docs/checkpoint.md lists them). A checkpoint saves state() and a
// resume applies the loaded values back; replica fault tolerance sends the same state to a replica that is behind.
//
//   titan::TrainingState state({.parameters = model.parameters(), .names = model.parameter_names(),
//                               .optimizer = &optimizer, .loader = loader.get(), .expert_biases = moe.expert_biases(),
//                               .mesh = &run.mesh()});
//   checkpointer.save(state.step, state.state(), /*last=*/false);
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "titan/train/run_state.hpp"

namespace titan {
class Optimizer;
class SemiSync;
struct LoraConfig;
namespace data {
class DataLoader;
}
namespace dist {
class Mesh;
}
namespace checkpoint {
struct State;
}

class TrainingState {
 public:
  /// What the state is made of (every pointer outlives the state).
  struct Parts {
    /// The model's trainable tensors, each once.
    std::vector<at::Tensor> parameters{};
    /// FQN of each of parameters: the checkpoint's keys (missing names become positional keys "param_<i>").
    std::vector<std::string> names{};
    /// Tensors that do not train (a LoRA run's frozen base weights), each once, and their FQNs.
    std::vector<at::Tensor> frozen{};
    std::vector<std::string> frozen_names{};
    /// The [lora] settings of a run whose `parameters` are LoRA adapters (null: none). The adapters are then group
    /// "lora", the frozen base group "model" (left out under save_adapter_only), the settings values["lora"].
    const LoraConfig* lora = nullptr;
    /// The optimizer whose state is saved (null: none).
    Optimizer* optimizer = nullptr;
    /// The training data loader (null: none).
    data::DataLoader* loader = nullptr;
    /// (FQN, (E) fp32 buffer) of each MoE layer's expert bias this rank holds.
    std::vector<std::pair<std::string, at::Tensor>> expert_biases{};
    /// Semi-synchronous training's outer state (null: none): group semi_sync, filled on load and healing.
    SemiSync* semi_sync = nullptr;
    /// Tensors of `parameters` whose key another rank writes (a pipeline's last stage's copy of the first stage's
    /// embedding, multi-token prediction: mtp_embedding_copies): loaded from that key, with their optimizer state,
    /// never written, so the checkpoint holds the weight once, as one process saves it.
    std::vector<at::Tensor> copies{};
    /// The mesh the tensors are sharded over (null: one process).
    const dist::Mesh* mesh = nullptr;
    /// What the run's numbers depend on besides the config (RunContext::run_state): recorded, compared on resume.
    RunState run_state{};
  };

  explicit TrainingState(Parts parts);

  /// The last completed step (0 before the first).
  int64_t step = 0;

  /// What a checkpoint holds now: groups model, optimizer, moe.<fqn> (expert biases), lr_scheduler ({last_epoch}),
  /// dataloader, train_state ({step, bf16_gemm}, rng_cpu); under LoRA also lora (the adapters and their settings);
  /// under semi-sync also semi_sync (DiLoCo's last synchronised parameters and outer momentum).
  /// `with_frozen`: the frozen base too when lora.save_adapter_only leaves it out of a save: what a load fills (the
  /// checkpointer takes it from checkpoint.initial_load_path then).
  checkpoint::State state(bool with_frozen = false) const;
  /// Applies what a loaded (or received) `state` holds: expert biases, the step, the CPU RNG and the loader's
  /// position (`values` are the loaded JSON groups; the model and optimizer tensors were loaded in place). Warns
  /// when the checkpoint's global batch or run state (bf16 GEMM kernel) differs from this run's.
  void apply(const checkpoint::State& state, const nlohmann::json& values);
  const Parts& parts() const { return parts_; }

 private:
  Parts parts_;
};

}  // namespace titan
