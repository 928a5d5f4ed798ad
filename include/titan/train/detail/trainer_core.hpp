// SPDX-License-Identifier: BSD-3-Clause
// The compiled, model-agnostic half of Trainer<Model>: config, device, seeds, tokenizer, data,
// optimizer, LR schedule, metrics and the step loop. It reaches the model only through ModelHandle,
// so none of this is re-instantiated per model type (the fmt print -> vprint pattern).
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/config.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/core/test_faults.hpp"
#include "titan/nn/loss.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/train/step.hpp"

namespace titan {
class Optimizer;
class LRSchedule;
class MetricsProcessor;
struct StepMetrics;
class Profiler;
class MemorySnapshotter;
namespace data {
class Tokenizer;
class DataLoader;
}  // namespace data
namespace dist {
class Mesh;
class ReplicaGroup;
}  // namespace dist
class Parallelized;
namespace parallel {
struct ParallelPlan;
class ExpertParallel;
}  // namespace parallel
namespace checkpoint {
class Checkpointer;
class HfAdapter;
struct State;
}  // namespace checkpoint
}  // namespace titan
namespace torch::nn {
class Module;
}

namespace titan::detail {
class Validator;
class PreemptionSignals;

/// What the core needs of a model, type-erased.
struct ModelHandle {
  std::string description{};                                  ///< e.g. "llama3 debugmodel"
  ModelForward forward{};                                     ///< tokens (B, S) and their context -> logits (B, S, V)
  parallel::StageForward stage_forward{};                     ///< pipeline stage s: input and context -> output
  std::vector<at::Tensor> parameters{};                       ///< trainable tensors, each once
  std::vector<std::string> parameter_names{};                 ///< FQN of each of parameters (checkpoint keys)
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter{};  ///< HF import/export; null = none
  int64_t num_params = 0;
  int64_t flops_per_token = 0;  ///< at training.seq_len
};

class TrainerCore {
 public:
  /// Validates the config, prepares the run directory, device, seeds, tokenizer and data loader.
  /// `model_vocab_size` bounds the tokenizer (and sizes one trained on first use).
  TrainerCore(JobConfig config, int64_t model_vocab_size);
  ~TrainerCore();
  TrainerCore(const TrainerCore&) = delete;
  TrainerCore& operator=(const TrainerCore&) = delete;

  const JobConfig& config() const { return config_; }
  const at::Device& device() const { return device_; }
  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  /// Seeds the global RNG and titan's layout-invariant init generator (debug.seed, or a logged
  /// random seed shared by all ranks).
  void seed_for_init() const;
  /// This rank's mesh (one process: a mesh of size 1).
  const dist::Mesh& mesh() const { return *mesh_; }
  /// Applies model.converters (float8: float8::convert_to_float8 with [float8]'s options) to the
  /// built model, before parallelize. Logs what it converted and skipped.
  void convert(torch::nn::Module& model);
  /// The modules the float8 converter converted (empty without it), for tests and logs.
  const std::vector<std::string>& float8_converted() const { return float8_converted_; }
  /// Applies the model's plan over the mesh (titan::parallelize) and keeps the handle for the
  /// trainer's life. Call before init_weights (ranks then fill only their shards).
  void parallelize(torch::nn::Module& model, const parallel::ParallelPlan& plan);
  /// Takes the model and builds optimizer, LR schedule and metrics around it.
  void attach_model(ModelHandle model);

  /// Runs until training.steps; throws on a non-finite loss naming the step.
  void train();
  /// One optimizer step (all gradient-accumulation microbatches); returns the logged record when
  /// this step was logged.
  void train_step();

  int64_t step() const { return step_; }
  /// The preemption signal all ranks agreed to stop on (checkpoint.preemption_signals), 0 when none.
  int stopped_by_signal() const { return stop_signal_; }
  int64_t grad_accum_steps() const { return grad_accum_steps_; }
  /// Losses of every step run so far (global token-mean), for tests and the golden curve.
  const std::vector<double>& loss_history() const { return losses_; }
  Optimizer& optimizer() { return *optimizer_; }
  /// This rank's memory by part: parameters, gradients and optimizer state from the tensors, the
  /// activations' and communication buffers' peaks since the last call (CPU: titan's tracker; CUDA:
  /// activations = the allocator's peak less the rest, communication not split out). Restarts the peaks.
  MemoryParts memory_parts();
  /// The parts of the last logged step (zeros before the first log).
  const MemoryParts& logged_memory() const { return last_memory_; }
  /// The training state a checkpoint holds: model, optimizer, lr_scheduler, dataloader, train_state.
  checkpoint::State checkpoint_state() const;

 private:
  /// Sum over the ranks of a mesh axis: "dp" (a value of this rank's batch -> of the global batch),
  /// "dp_cp" (of this rank's part of the sequences -> of the global batch).
  template <class T>
  T all_reduce_sum(T value, const char* axis) const;
  /// Loads a checkpoint or initial weights per checkpoint.* (called by attach_model).
  void load_checkpoint();
  /// One step's work (train_step wraps it: profiler steps, out-of-memory snapshots).
  void run_step();
  /// Writes the pipeline's measured timeline of this step to the run folder (pp rank 0 of rank 0).
  void write_pipeline_timeline() const;
  /// Saves when checkpoint.* says this step is a save step.
  void maybe_save_checkpoint();
  /// Waits for an in-flight async save (end of training).
  void wait_for_checkpoint();
  /// fault_tolerance.enable: connects this rank to the lighthouse (called by attach_model).
  void start_replicas();
  /// The quorum of the coming step; a replica behind the others receives their state first.
  void join_replicas();
  /// Averages the gradients over the live replicas; false when the step must be run again.
  bool commit_over_replicas();
  /// Applies a loaded or received training state's values (step, data position, RNG, expert biases).
  void apply_state(const checkpoint::State& state, const nlohmann::json& values);

  JobConfig config_;
  at::Device device_ = at::kCPU;
  int64_t seed_ = 0;
  std::unique_ptr<dist::Mesh> mesh_;
  std::unique_ptr<Parallelized> parallel_;         // the model's parallel state (one device: nothing applied)
  std::unique_ptr<parallel::ExpertParallel> moe_;  // the model's MoE layers: expert-bias updates each step
  std::vector<std::pair<std::string, at::Tensor>> expert_biases_;  // FQN, (E) fp32 buffer: checkpointed
  LossFn loss_;                                                    // empty: cross_entropy_sum
  bool bf16_autocast_ = false;  // forwards under bf16 autocast: fp32 parameters that no FSDP casts
  int64_t dp_degree_ = 1;
  int64_t dp_rank_ = 0;
  int64_t grad_accum_steps_ = 1;
  std::shared_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<Validator> validator_;  // null unless validation.enable
  ModelHandle model_;
  StepModel step_model_;  // model_'s forwards, as the step parts take them
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<std::string> float8_converted_;
  std::unique_ptr<LRSchedule> schedule_;
  std::unique_ptr<MetricsProcessor> metrics_;
  std::unique_ptr<MemoryTracker> memory_;  // CPU: this rank's allocations by part during steps
  MemoryParts last_memory_{};
  std::unique_ptr<Profiler> profiler_;              // profiling.enable_profiling
  std::unique_ptr<MemorySnapshotter> snapshotter_;  // profiling.enable_memory_snapshot (uses memory_)
  testing::Faults faults_;                          // the test faults, read once (kill and hang: first attempt only)
  std::unique_ptr<PreemptionSignals> preemption_;   // checkpoint.preemption_signals, armed when saving
  int stop_signal_ = 0;                             // the signal every rank agreed to stop on after this step
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
  std::unique_ptr<dist::ReplicaGroup> replicas_;  // fault_tolerance.enable: the quorum across replica groups
  int64_t step_ = 0;
  std::vector<double> losses_;
};

}  // namespace titan::detail
