// SPDX-License-Identifier: BSD-3-Clause
// titan::parallelize(model, mesh, plan): the one way a model becomes parallel. It validates the
// whole plan against the model and the mesh before changing anything, applies it in the fixed order
// (pipeline split, TP, CP, EP, AC, FSDP/HSDP/DDP) and returns the one handle that owns every piece of
// parallel state. The handle is move-only and [[nodiscard]]; the model is usable exactly as long as
// it lives (afterwards a layer's read of a sharded parameter is an error naming the parameter).
//
//   titan::parallel::ParallelPlan plan = model->parallel_plan(config, mesh);
//   auto parallel = titan::parallelize(*model, mesh, plan);
//   model->init_weights();                                            // each rank fills its shards
//   at::Tensor loss = parallel.cross_entropy_sum(model->forward(tokens), labels) / n_tokens;
//
// After the first backward it checks what it cannot see at apply time: a parameter under the plan
// that a layer read directly instead of through with_param (a torch::nn::Linear under DDP would
// silently diverge), or a module the plan named whose forward never went through module_call. A first
// forward that fails on a sharded parameter read directly (FSDP, TP) is reported by run_forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

#include "titan/parallel/plan.hpp"

namespace torch::nn {
class Module;
}
namespace titan::dist {
class Mesh;
}
namespace titan::parallel {
class Pipeline;
class TensorParallel;
class DataParallel;
class ContextParallel;
class ExpertParallel;
struct SequenceBatch;
struct LocalBatch;
namespace detail {
struct ParallelizedState;
}
}  // namespace titan::parallel

namespace titan {

/// Everything parallelize() applied to one model on this rank.
class [[nodiscard]] Parallelized {
 public:
  /// Nothing applied (one device).
  Parallelized();
  ~Parallelized();
  Parallelized(Parallelized&&) noexcept;
  Parallelized& operator=(Parallelized&&) noexcept;
  Parallelized(const Parallelized&) = delete;
  Parallelized& operator=(const Parallelized&) = delete;

  /// "PP(pp=2, 1F1B, stages [0] of 2, microbatch size 1) + TP(tp=2, ...) + EP(ep=2, ...) + FSDP(dp_shard=2)", or
  /// "one device".
  std::string describe() const;
  /// The pipeline runtime of this rank's stages; null when the plan has no pipeline split.
  parallel::Pipeline* pipeline() const;
  /// The tensor-parallel state; null when the mesh has no tp axis.
  parallel::TensorParallel* tensor_parallel() const;
  /// The FSDP/HSDP/DDP state; null when the mesh has no data-parallel axis.
  parallel::DataParallel* data_parallel() const;
  /// The FSDP (or DDP) of the expert-parallel experts over efsdp x dp_replicate; null without it.
  parallel::DataParallel* expert_data_parallel() const;
  /// The context-parallel split; null when the mesh has no cp axis.
  parallel::ContextParallel* context_parallel() const;
  /// The expert-parallel MoE layers; null when the mesh has no ep axis (ep = 1).
  parallel::ExpertParallel* expert_parallel() const;
  /// This rank's part of a batch of whole sequences (its share of the sequence under context
  /// parallelism, else all of it) and the attention context to pass to the model's forward: true
  /// RoPE positions, documents, the split.
  parallel::LocalBatch local_batch(const parallel::SequenceBatch& batch) const;
  /// Whether the model's logits come out vocab-sharded (loss parallel).
  bool loss_parallel() const;
  /// Sum of per-token cross-entropy over valid labels of the model's logits: on the vocab shards
  /// under loss parallel, plain otherwise.
  at::Tensor cross_entropy_sum(const at::Tensor& logits,         // (B, S, V) or (B, S, V/tp)
                               const at::Tensor& labels) const;  // (B, S) int64, -100 = skip
  /// Throws, naming each, when a parameter under the plan was never read through with_param or a
  /// module the plan named never ran through module_call. Runs by itself at the end of the first
  /// backward that reaches the plan's parameters; the Trainer also calls it after its first step.
  void check_contracts() const;
  /// Runs `forward` (a forward of the model under this handle) and returns its output. Before the contract has
  /// passed (the first forward), an ATen error from it comes back naming the sharded parameters no layer has read
  /// through with_param yet: under FSDP or TP a layer that reads a parameter directly sees only this rank's shard and
  /// fails inside ATen on its shape (under DDP, whole parameters, the first backward reports it).
  /// titan::forward_backward runs every forward through it; a loop of your own that calls the model's forward
  /// itself writes run_forward([&] { return model->forward(tokens); }).
  at::Tensor run_forward(const std::function<at::Tensor()>& forward) const;

 private:
  friend Parallelized parallelize(torch::nn::Module&, const dist::Mesh&, const parallel::ParallelPlan&);
  explicit Parallelized(std::unique_ptr<parallel::detail::ParallelizedState> state);
  std::unique_ptr<parallel::detail::ParallelizedState> state_;
};

/// Validates plan against model and mesh, then applies it. Collective over the mesh: every rank calls
/// it with the same plan. Errors name the plan section, module path or parameter.
Parallelized parallelize(torch::nn::Module& model, const dist::Mesh& mesh, const parallel::ParallelPlan& plan);

}  // namespace titan
