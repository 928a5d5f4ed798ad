// SPDX-License-Identifier: BSD-3-Clause
// ParallelPlan: the one declarative description of how a model is parallelized, applied by
// titan::parallelize(model, mesh, plan) in a fixed order (pipeline split, TP, CP, EP, AC, FSDP/HSDP/DDP).
// A model supplies its plan through TrainableModel's parallel_plan(config, mesh); a custom loop
// builds one by hand. Every section is a plain value with designated initialisers.
//
// Tensor-parallel styles, by module path, say what a module receives and returns along the tp axis
// (activations are (B, S, ...), the sequence on dim 1):
//
//   ColwiseParallel      weight and bias Shard(0); output keeps the local columns (Shard(-1)) or gathers them
//   RowwiseParallel      weight Shard(1) (an Embedding: Shard(0), the vocabulary); the partial output is
//                        all-reduced (Replicate) or reduce-scattered along the sequence (Shard(1)), then the
//                        bias (whole) is added once
//   SequenceParallel     a norm on sequence-sharded activations; its weight's gradient is all-reduced
//   PrepareModuleInput   redistributes a module's input once for the layers inside it, e.g. gathers
//                        the sequence (Shard(1) -> Replicate) before wq/wk/wv
//   PrepareModuleOutput  redistributes a module's output, e.g. keeps this rank's sequence shard of a
//                        position embedding's (Replicate -> Shard(1)) to add to the token embedding's
//
// Example (a two-layer MLP, Megatron style, then FSDP with one unit per block):
//   ParallelPlan plan{.data_parallel = {.units = {{"mlp"}}}};
//   plan.tensor_parallel.add("mlp.up", ColwiseParallel{}).add("mlp.down", RowwiseParallel{});
//   auto parallel = titan::parallelize(model, mesh, plan);  // keep it alive as long as the model
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "titan/core/choices.hpp"
#include "titan/layout/placement.hpp"
#include "titan/parallel/data_parallel_options.hpp"
#include "titan/parallel/expert_parallel_plan.hpp"

namespace torch::nn {
class Module;
}

namespace titan::parallel {

/// Linear with output features split over tp (weight and bias Shard(0)), or a head tied to an embedding
/// (nn::TiedLinear) computing on the shard the embedding's RowwiseParallel made.
struct ColwiseParallel {
  /// Replicate() (used as is; its gradient is all-reduced) or Shard(d) (gathered along d first).
  Placement input_layout = Placement::replicate();
  /// Shard(-1): return the local output features; Replicate(): gather them on every rank.
  Placement output_layout = Placement::shard(-1);
  /// The output is the model's logits, kept vocab-sharded for TensorParallel::cross_entropy_sum.
  bool loss_parallel = false;
};

/// Linear with input features split over tp (weight Shard(1); the bias whole, added once after the sum, its gradient
/// summed over tp under a Shard(d) output, where each rank saw its chunk of the tokens), or a vocab-parallel Embedding
/// (weight Shard(0); out-of-shard tokens contribute zeros).
struct RowwiseParallel {
  /// Shard(-1): the local input features (a colwise output); Replicate(): the whole input (tokens).
  Placement input_layout = Placement::shard(-1);
  /// Replicate(): all-reduce the partial sums; Shard(d): reduce-scatter them along d (the sequence).
  Placement output_layout = Placement::replicate();
};

/// A norm applied to sequence-sharded activations; weights replicated, gradients all-reduced.
struct SequenceParallel {};

/// Redistributes a module's input before the layers inside it run.
struct PrepareModuleInput {
  /// Layout the input arrives in: Shard(d) or Replicate().
  Placement input_layout = Placement::shard(1);
  /// Layout the module's layers expect: Replicate() (the layers inside then own the gradient sum).
  Placement desired_input_layout = Placement::replicate();
};

/// Redistributes a module's output after the layers inside it ran (torch's PrepareModuleOutput). Replicate() ->
/// Shard(d): this rank's chunk along d, the gradient all-gathered back, so replicated weights inside get the whole
/// gradient on every rank (a learned position embedding under sequence parallelism); Shard(d) -> Replicate(): gathered,
/// each rank's chunk of the (replicated) gradient back.
struct PrepareModuleOutput {
  /// Layout the module's layers produce: Replicate() or Shard(d).
  Placement output_layout = Placement::replicate();
  /// Layout its consumers expect: Shard(d) from Replicate(), or Replicate() from Shard(d).
  Placement desired_output_layout = Placement::shard(1);
};

using ParallelStyle =
    std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, PrepareModuleOutput>;

/// "ColwiseParallel(input=Shard(1), output=Shard(-1), loss_parallel)"
std::string format_as(const ParallelStyle& style);

/// Tensor (and sequence) parallelism over the mesh's tp axis: module path -> style.
struct TensorParallelPlan {
  /// (module path, style), applied in order; "" names the root module.
  std::vector<std::pair<std::string, ParallelStyle>> styles{};
  /// Async TP: split each sequence all-gather / reduce-scatter into batch chunks and compute one
  /// chunk while the next one's collective is in flight (same results; batch rows must be independent).
  bool async = false;
  /// Batch chunks per overlapped collective (async only).
  int64_t async_chunks = 2;
  /// Record the async-TP event trace (tests).
  bool trace = false;

  TensorParallelPlan& add(std::string path, ParallelStyle style) {
    styles.emplace_back(std::move(path), std::move(style));
    return *this;
  }
};

/// FSDP (dp_shard), HSDP (dp_replicate x dp_shard) or DDP (dp_replicate), as the mesh's axes say.
struct DataParallelPlan {
  /// Module paths of each unit in forward order (a unit may span modules, e.g. {"norm", "output"});
  /// parameters under none of them form the root unit.
  std::vector<std::vector<std::string>> units{};
  /// Reshard policy, mixed precision, collectives.
  DataParallelOptions options{};
};

/// Activation checkpointing: modules whose forward keeps only its input and runs again in backward
/// (see parallel/activation_checkpoint.hpp; the module's forward goes through checkpoint_call).
struct ActivationCheckpointPlan {
  /// Module paths to recompute (e.g. every transformer block, or every N-th).
  std::vector<std::string> modules{};
  /// Replay the forward's RNG state in the recompute (dropout draws the same mask).
  bool preserve_rng_state = true;
  /// Per operator: keep every other matmul's output and attention's, recompute the rest (nn/saved_ops.hpp).
  bool per_op = false;
  /// Under per_op: Linear modules whose matmul is always recomputed, by path substring (torchtitan's match).
  std::vector<std::string> force_recompute_mm{};
};

/// Pipeline parallelism over the mesh's pp axis: the model cut into stages (module paths), the
/// schedule that runs them and the microbatch size. Each rank builds and holds only the modules of
/// its own stages (see parallel/pipeline.hpp).
struct PipelinePlan {
  /// Module paths per stage, in pipeline order (every stage of the pipeline, not only this rank's).
  std::vector<std::vector<std::string>> stages{};
  /// The schedule; it also places stages on ranks (looped, or V-shaped for ZBV and DualPipeV).
  PipelineSchedule schedule = PipelineSchedule::schedule_1f1b;
  /// A torchtitan CSV schedule file; when set it replaces `schedule` (placement read from the file).
  std::string schedule_csv{};
  /// Sequences per microbatch: a batch of B sequences runs as B / microbatch_size microbatches.
  int64_t microbatch_size = 1;
  /// Run the program's overlapped forward/backward pairs (DualPipeV's) at the same time: the backward
  /// on a second thread while the forward runs on the rank's, results bitwise those of running them
  /// one after the other. Only where the stages' layers issue no collectives of their own (every mesh
  /// axis but pp of size 1); elsewhere the pairs run one after the other (see parallel/pipeline.hpp).
  bool overlap_f_b = true;
};

/// Context parallelism over the mesh's cp axis: every batch's sequence split over the cp ranks
/// (Parallelized::local_batch), the named attention modules attending across the split exactly. FSDP
/// then shards over dp_shard x cp (the cp ranks hold different tokens of the same batch).
struct ContextParallelPlan {
  /// Module paths of the attention modules (each an nn::ContextParallelCapable).
  std::vector<std::string> attention_modules{};
  /// headtail load balancing: 2 x cp chunks, rank r holds chunks r and 2cp-1-r (even causal work);
  /// false: rank r holds the r-th contiguous 1/cp of the sequence.
  bool load_balance = true;
  /// K/V exchange: allgather (every rank's K/V gathered once) or alltoall (passed around the ring,
  /// the next transfer overlapping the current block's attention).
  CpRotateMethod rotate = CpRotateMethod::allgather;
};

/// The whole plan, one section per dimension, in the order parallelize() applies them.
struct ParallelPlan {
  /// Cut into stages first.
  PipelinePlan pipeline{};
  /// Then shard weights over tp.
  TensorParallelPlan tensor_parallel{};
  /// Then shard attention's sequence over cp.
  ContextParallelPlan context_parallel{};
  /// Then shard the MoE layers' routed experts over ep (a mesh with ep > 1); data parallelism then
  /// leaves them out (they are reduced over efsdp x dp_replicate by ExpertParallel).
  ExpertParallelPlan expert_parallel{};
  /// Then wrap modules for recomputation.
  ActivationCheckpointPlan activation_checkpoint{};
  /// Last, FSDP/HSDP/DDP over the data-parallel axes.
  DataParallelPlan data_parallel{};
};

/// One "path: Style(...)" line per tensor-parallel entry, then one line per non-empty section.
std::string format_as(const ParallelPlan& plan);

/// Data-parallel units for a model with no better grouping: one per direct child, in registration order.
std::vector<std::vector<std::string>> units_per_child(const torch::nn::Module& model);

}  // namespace titan::parallel
