// SPDX-License-Identifier: BSD-3-Clause
// ParallelPlan: which tensor-parallel style each module gets, by module path, as torchtitan's
// parallelize_module plans name them. Styles are plain values; their layouts say what the module
// receives and returns along the tp axis (activations are (B, S, ...), the sequence on dim 1):
//
//   ColwiseParallel     weight Shard(0); output keeps the local columns (Shard(-1)) or gathers them
//   RowwiseParallel     weight Shard(1) (an Embedding: Shard(0), the vocabulary); the partial output is
//                       all-reduced (Replicate) or reduce-scattered along the sequence (Shard(1))
//   SequenceParallel    a norm on sequence-sharded activations; its weight's gradient is all-reduced
//   PrepareModuleInput  redistributes a module's input once for the layers inside it, e.g. gathers
//                       the sequence (Shard(1) -> Replicate) before wq/wk/wv
//
// Example (a two-layer MLP, Megatron style):
//   ParallelPlan plan;
//   plan.add("mlp.up", ColwiseParallel{}).add("mlp.down", RowwiseParallel{});
//   fmt::print("{}", plan);  // one "path: style" line per entry
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "titan/layout/sharded_param.hpp"

namespace titan::parallel {

/// Linear with output features split over tp (weight Shard(0)).
struct ColwiseParallel {
  /// Replicate() (used as is; its gradient is all-reduced) or Shard(d) (gathered along d first).
  Placement input_layout = Placement::replicate();
  /// Shard(-1): return the local output features; Replicate(): gather them on every rank.
  Placement output_layout = Placement::shard(-1);
  /// The output is the model's logits, kept vocab-sharded for TensorParallel::cross_entropy_sum.
  bool loss_parallel = false;
};

/// Linear with input features split over tp (weight Shard(1)), or a vocab-parallel Embedding (weight
/// Shard(0); out-of-shard tokens contribute zeros).
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

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput>;

/// "ColwiseParallel(input=Shard(1), output=Shard(-1), loss_parallel)"
std::string to_string(const ParallelStyle& style);

/// Module path -> style, applied in order.
struct ParallelPlan {
  std::vector<std::pair<std::string, ParallelStyle>> entries{};  ///< (module path, style)

  ParallelPlan& add(std::string path, ParallelStyle style) {
    entries.emplace_back(std::move(path), std::move(style));
    return *this;
  }
  /// One "path: style" line per entry.
  std::string str() const;
};

/// What a model's own plan function is asked for (torchtitan's TP switches).
struct TensorParallelPlanOptions {
  /// Keep activations sequence-sharded between blocks (norms SequenceParallel).
  bool sequence_parallel = true;
  /// Leave the logits vocab-sharded and compute the loss on the shards.
  bool loss_parallel = true;
};

/// fmt support: fmt::format("{}", plan).
inline std::string format_as(const ParallelPlan& plan) { return plan.str(); }

}  // namespace titan::parallel
