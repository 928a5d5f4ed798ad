// SPDX-License-Identifier: BSD-3-Clause
// The compiled, model-agnostic half of Trainer<Model>: it holds the run's training components and runs the steps.
// It reaches the model only through TrainedModel, so none of this is re-instantiated per model type.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "titan/core/test_faults.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/train/rank_model.hpp"
#include "titan/train/step.hpp"
#include "titan/train/training_state.hpp"

namespace titan {
class Optimizer;
class LRSchedule;
class RunContext;
class MoeBalancing;
class MtpLoss;
class Checkpointing;
class Validation;
class Evaluation;
class Preemption;
class ReplicaFaultTolerance;
class SemiSync;
class Profiling;
namespace data {
class Tokenizer;
class DataLoader;
}  // namespace data
namespace checkpoint {
class HfAdapter;
}
}  // namespace titan

namespace titan::detail {

/// What the loop needs of a model, type-erased (RankModel<Model> fills it).
struct TrainedModel {
  /// The module this rank holds (its pipeline stages).
  torch::nn::Module* module = nullptr;
  /// Its parallel state.
  const Parallelized* parallel = nullptr;
  /// Its forwards as the step parts run them.
  StepModel step_model{};
  /// Trainable tensors, each once.
  std::vector<at::Tensor> parameters{};
  /// FQN of each of parameters (checkpoint keys).
  std::vector<std::string> names{};
  /// Module paths whose parameters AdamW steps under optimizer.name = "Muon": the embeddings and the head.
  std::vector<std::string> adamw_modules{};
  /// Tensors a converter froze (a LoRA run's base weights), each once, and their FQNs.
  std::vector<at::Tensor> frozen{};
  std::vector<std::string> frozen_names{};
  /// HF import/export; null = none.
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter{};
  /// The whole model's parameters and FLOPs per token.
  ModelCounts counts{};
  /// Rows of its embedding: the tokenizer must fit in it.
  int64_t vocab_size = 0;
  /// Forwards under bf16 autocast.
  bool bf16_autocast = false;
};

class TrainingLoop {
 public:
  /// Builds the components around `model` (data, optimizer, schedule, MoE balancing, training state, profiling,
  /// metrics, validation, preemption), loads a checkpoint per checkpoint.*, joins the replica groups.
  TrainingLoop(const RunContext& run, TrainedModel model);
  ~TrainingLoop();
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  /// Runs until training.steps (or a preemption signal); with checkpoint.create_seed_checkpoint writes the seed
  /// checkpoint instead. Throws on a non-finite loss naming the step.
  void train();
  /// One optimizer step (all gradient-accumulation microbatches).
  void train_step();

  int64_t step() const { return state_->step; }
  /// The preemption signal all ranks agreed to stop on, 0 when none.
  int stopped_by_signal() const { return stop_signal_; }
  /// Losses of every step run so far (global token-mean), for tests and the golden curve.
  const std::vector<double>& loss_history() const { return losses_; }
  Optimizer& optimizer() { return *optimizer_; }
  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  /// The parts of the last logged step (zeros before the first log).
  const MemoryParts& logged_memory() const { return last_memory_; }
  /// This rank's memory by part (see Profiling::memory_parts); restarts the peaks.
  MemoryParts memory_parts();
  /// The training state a checkpoint holds.
  const TrainingState& training_state() const { return *state_; }

 private:
  /// One step: replicas joined, data, forward and backward, commit, MoE balancing, optimizer, metrics,
  /// validation, the preemption vote, checkpoint.
  void run_step();
  ForwardBackwardResult forward_and_backward(int64_t step, const StepBatch& batch);
  void log_step(int64_t step, const ForwardBackwardResult& fb, double grad_norm, double lr,
                const std::vector<at::Tensor>& loads);
  void validate(int64_t step);
  void evaluate(int64_t step);
  /// Writes the pipeline's measured timeline of this step to the run folder (pp rank 0 of rank 0).
  void write_pipeline_timeline(int64_t step) const;
  void log_setup() const;
  /// lora.quantize_base: the adapted Linears' base weights to NF4, once loaded.
  void quantize_base();

  const RunContext& run_;
  TrainedModel model_;
  std::shared_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LRSchedule> schedule_;
  std::unique_ptr<MoeBalancing> moe_;
  std::unique_ptr<MtpLoss> mtp_;
  std::unique_ptr<SemiSync>
      semi_sync_;  // null unless fault_tolerance.semi_sync_method; outlives state_ (it points here)
  std::unique_ptr<TrainingState> state_;
  std::unique_ptr<Checkpointing> checkpoints_;
  std::unique_ptr<Validation> validation_;  // null unless validation.enable
  std::unique_ptr<Evaluation> evaluation_;  // null unless eval.interval > 0
  std::unique_ptr<Preemption> preemption_;
  std::unique_ptr<ReplicaFaultTolerance> replicas_;  // null unless fault_tolerance.enable
  std::unique_ptr<Profiling> profiling_;
  std::optional<MetricsProcessor> metrics_;
  testing::Faults faults_;  // read once (kill and hang: first attempt only)
  MemoryParts last_memory_{};
  int stop_signal_ = 0;
  std::vector<double> losses_;
  std::vector<at::Tensor> nf4_bases_;  // the NF4 tensors' parts (codes, scalers, factors, mean): QLoRA's held base
};

}  // namespace titan::detail
