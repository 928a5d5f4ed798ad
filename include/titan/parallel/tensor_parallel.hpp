// SPDX-License-Identifier: BSD-3-Clause
// Tensor (and sequence) parallelism: a ParallelPlan applied to any model built from titan's layers
// over the mesh's tp axis. Each named module's parameters are replaced by their tp shard (bound as
// ShardedParams, so init, clipping, FSDP on top and checkpoints see the layout) and its forward runs
// through the style's redistribution (Megatron's f/g and the sequence-parallel all-gather /
// reduce-scatter, as autograd functions). Apply it before data parallelism: FSDP then shards the tp
// shards over dp_shard (2-D).
//
//   auto tp = titan::parallel::parallelize_module(model, mesh, plan);
//   at::Tensor logits = model.forward(tokens);           // vocab-sharded under loss parallel
//   at::Tensor loss = tp->cross_entropy_sum(logits, labels) / n_valid;
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "titan/parallel/plan.hpp"

namespace torch::nn {
class Module;
}
namespace titan::dist {
class Mesh;
class ProcessGroup;
}  // namespace titan::dist

namespace titan::parallel {

namespace detail {
struct TensorParallelState;
}

struct TensorParallelOptions {
  /// Mesh axis the plan shards over.
  std::string axis = "tp";
  /// Async TP: split each sequence all-gather / reduce-scatter into batch chunks and compute one
  /// chunk while the next one's collective is in flight (torchtitan's enable_async_tensor_parallel,
  /// here without compile). Same results. Assumes the modules it wraps treat batch rows
  /// independently (true of transformer blocks); a batch not divisible by the chunks runs blocking.
  bool async = false;
  /// Batch chunks per overlapped collective (async only).
  int64_t async_chunks = 2;
  /// Record the event trace (tests).
  bool trace = false;
};

/// One event of the async-TP trace, in program order.
struct TensorParallelEvent {
  enum class Kind { kIssued, kFinished, kComputed };
  Kind kind = Kind::kIssued;  ///< a chunk's collective issued / finished, or its compute done
  int64_t chunk = 0;          ///< batch chunk index
};

/// The applied plan on one rank. Keep it alive as long as the model (it owns the module hooks).
class TensorParallel {
 public:
  ~TensorParallel();
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  /// "TP(tp=2, sequence parallel, loss parallel)"
  std::string describe() const;
  const ParallelPlan& plan() const;
  int64_t degree() const;
  /// Whether the plan leaves the logits vocab-sharded for the loss.
  bool loss_parallel() const;
  /// The trace since the last clear_trace() (empty unless options.trace).
  std::vector<TensorParallelEvent> trace() const;
  void clear_trace();
  /// Sum of per-token cross-entropy over valid labels of the logits the model returns: computed on
  /// the vocab shards without gathering them under loss parallel, plain otherwise.
  at::Tensor cross_entropy_sum(const at::Tensor& logits,   // (B, S, V) or (B, S, V/tp)
                               const at::Tensor& labels) const;  // (B, S) int64, -100 = skip

 private:
  friend std::shared_ptr<TensorParallel> parallelize_module(torch::nn::Module&, const dist::Mesh&, const ParallelPlan&,
                                                            const TensorParallelOptions&);
  explicit TensorParallel(std::unique_ptr<detail::TensorParallelState> state);
  std::unique_ptr<detail::TensorParallelState> state_;
};

/// Checks plan against model before anything changes: every path names a module of the kind its
/// style needs, and every split divides by degree. Errors name the path.
void validate_plan(const torch::nn::Module& model, const ParallelPlan& plan, int64_t degree);

/// Validates, then applies plan over the mesh's tp axis. Returns nullptr when that axis has size 1.
std::shared_ptr<TensorParallel> parallelize_module(torch::nn::Module& model, const dist::Mesh& mesh,
                                                   const ParallelPlan& plan, const TensorParallelOptions& options = {});

/// Loss parallel: sum over valid labels of the cross-entropy of logits split along the vocabulary
/// over group (this rank holds columns [vocab_offset, vocab_offset + V/tp)). Never materialises the
/// whole vocabulary: three all-reduces of (B*S) values (max, sum of exponentials, target logit).
at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& logits,  // (B, S, V/tp)
                                            const at::Tensor& labels,  // (B, S) int64, -100 = skip
                                            const dist::ProcessGroup& group, int64_t vocab_offset);

}  // namespace titan::parallel
