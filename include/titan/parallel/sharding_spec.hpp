// SPDX-License-Identifier: BSD-3-Clause
// ShardingSpec: how a model may be sharded, declared once by the model, with no job config and no mesh. It
// names the model's modules by role (FSDP units, each module's tensor-parallel role, attention and MoE modules,
// the blocks activation checkpointing may wrap, the top-level modules a pipeline may cut between, tied
// weights); the planner (parallel/planner.hpp) turns it, with the parallelism, checkpointing and precision
// settings, into the ParallelPlan that titan::parallelize applies. It is what torchtitan's per-family
// parallelize.py is, as data.
//
//   ShardingSpec spec{.model = "mlp", .fsdp_units = {{"up"}, {"down"}}};
//   spec.tensor_parallel = {{"up", TensorParallelRole::colwise}, {"down", TensorParallelRole::rowwise}};
//   ParallelPlan plan = parallel::plan(spec, {}, mesh.shape());
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/parallel/plan.hpp"

namespace titan::parallel {

/// What a module is to tensor parallelism. The planner picks each role's style for the job (sequence
/// parallelism, loss parallelism, expert tensor parallelism); docs/tensor_parallel.md shows the table.
enum class TensorParallelRole {
  /// A Linear whose output features are split over tp (q/k/v, w1/w3); its bias is split with them.
  colwise,
  /// A Linear whose input features are split (wo, w2); the partial outputs are summed (or reduce-scattered along
  /// the sequence under sequence parallelism) and its bias is added once, after the sum.
  rowwise,
  /// An Embedding over the vocabulary, rows split over tp; its output summed (or sequence-scattered).
  vocab_embedding,
  /// An Embedding over positions (GPT-2's learned absolute positions), whole on every rank, whose output
  /// (B or 1, S, D) adds to the token embedding's: under sequence parallelism each rank keeps its sequence shard of
  /// it, and the gradient is gathered back whole; without, nothing to do.
  position_embedding,
  /// A module applied token by token on the residual stream (a norm): on sequence shards under sequence
  /// parallelism, weights whole, gradients summed over tp.
  sequence_norm,
  /// A module whose weights stay whole on each rank while it sees every rank's input or one head's features
  /// (Qwen3's q_norm/k_norm, MLA's down-projections): gradients summed over tp.
  replicated,
  /// A container (attention, feed-forward) whose input is gathered from the sequence shards once for the
  /// layers inside it.
  module_input,
  /// The output projection: colwise; the logits stay vocab-sharded under loss parallel, else gathered. A head tied to
  /// the vocab_embedding (an nn::TiedLinear, listed in ShardingSpec::tied) computes on the embedding's vocabulary
  /// shard, which is the same split.
  head,
  /// An MoE layer (listed in ShardingSpec::moe too): each rank's sequence shard through experts whole on every
  /// rank (gradients summed over tp), or, under expert tensor parallelism, through experts that expert
  /// parallelism splits, its `replicated` parts whole.
  moe,
};

/// An MoE layer (an nn::MoE) for expert parallelism.
struct MoeModule {
  /// Its module path ("layers.1.moe").
  std::string path{};
  /// Its parts, relative to path, whose weights stay whole under tensor parallelism while the routed experts
  /// are split over it (expert tensor parallelism): the router, shared experts.
  std::vector<std::string> replicated{};
};

/// An axis the model cannot be sharded over, and why (the planner's error quotes it).
struct RefusedAxis {
  /// "tp", "cp", "pp", "ep" or "etp"; "cp_kv": cp only by Ulysses (context_parallel_rotate_method ulysses), not by
  /// the K/V exchanges (allgather, alltoall); "cp_load_balance": cp only over contiguous shards
  /// (context_parallel_load_balancer None), for a recurrence that runs through the sequence rank to rank.
  std::string axis{};
  /// Why, and what to use instead.
  std::string reason{};
};

struct ShardingSpec {
  /// The model's name in errors ("titan::llama3").
  std::string model = "model";
  /// FSDP/HSDP/DDP units in forward order (module paths; a unit may span modules, e.g. {"norm", "output"});
  /// parameters under none form the root unit.
  std::vector<std::vector<std::string>> fsdp_units{};
  /// (module path, role) in forward order; modules not named stay replicated and see replicated activations.
  std::vector<std::pair<std::string, TensorParallelRole>> tensor_parallel{};
  /// Activations between tensor-parallel regions may be sequence-sharded (sequence parallelism, torchtitan's); false:
  /// they stay replicated (Megatron's plain TP), and sequence_norm / moe entries are left out.
  bool sequence_parallel = true;
  /// (module path, style) used as written, after the roles: the model's own exceptions.
  std::vector<std::pair<std::string, ParallelStyle>> tensor_parallel_styles{};
  /// (what, count) that the tensor-parallel degree must divide, named in the error ({"n_heads", 32}).
  std::vector<std::pair<std::string, int64_t>> tensor_parallel_divides{};
  /// Attention modules (each an nn::ContextParallelCapable): they attend across the context-parallel split.
  std::vector<std::string> attention{};
  /// MoE layers: their routed experts over ep (and etp).
  std::vector<MoeModule> moe{};
  /// The blocks activation checkpointing may wrap, in order (selective N counts along this list).
  std::vector<std::string> blocks{};
  /// The top-level modules a pipeline may cut between (empty layer_modules: no pipeline split possible).
  PipelineSplit pipeline{};
  /// Training FLOPs per token of pipeline.layer_modules (and input, output) for a split by FLOPs; empty layers:
  /// not known (the planner then refuses parallelism.pipeline_parallel_split = flops).
  PipelineModuleCosts pipeline_costs{};
  /// (user, owner) of tied weights by FQN ({"output.weight", "tok_embeddings.weight"}): the user's module reads the
  /// owner's parameter (nn::TiedLinear), which the model holds once. Under tensor parallelism the user's module must
  /// have the head role and the owner's the vocab_embedding role (one vocabulary split serves both); a pipeline would
  /// put them on two stages and is refused.
  std::vector<std::pair<std::string, std::string>> tied{};
  /// Axes the model cannot be sharded over.
  std::vector<RefusedAxis> refused{};
};

}  // namespace titan::parallel
