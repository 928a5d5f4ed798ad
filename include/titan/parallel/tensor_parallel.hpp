// SPDX-License-Identifier: BSD-3-Clause
// Tensor (and sequence) parallelism: the state a TensorParallelPlan leaves on one rank, owned by the
// handle titan::parallelize() returns. Each named module's parameters are replaced by their tp shard
// (bound as ShardedParams, so init, clipping, FSDP on top and checkpoints see the layout) and its
// forward runs through the style's redistribution (Megatron's f/g and the sequence-parallel
// all-gather / reduce-scatter, as autograd functions).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}
namespace titan::dist {
class Mesh;
class ProcessGroup;
}  // namespace titan::dist

namespace titan::parallel {

class TensorParallel;
struct TensorParallelPlan;
namespace detail {
struct TensorParallelState;
std::unique_ptr<TensorParallel> apply_tensor_parallel(torch::nn::Module&, const dist::Mesh&, const TensorParallelPlan&);
}  // namespace detail

/// One event of the async-TP trace, in program order.
struct TensorParallelEvent {
  enum class Kind { kIssued, kFinished, kComputed };
  Kind kind = Kind::kIssued;  ///< a chunk's collective issued / finished, or its compute done
  int64_t chunk = 0;          ///< batch chunk index
};

/// The applied tensor-parallel plan on one rank (owned by the parallelize() handle).
class TensorParallel {
 public:
  ~TensorParallel();
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  /// "TP(tp=2, sequence parallel, loss parallel)"
  std::string describe() const;
  const TensorParallelPlan& plan() const;
  /// Machinery (hooks and bound parameters), for parallelize()'s checks.
  const detail::TensorParallelState& state() const;
  int64_t degree() const;
  /// Whether the plan leaves the logits vocab-sharded for the loss.
  bool loss_parallel() const;
  /// The trace since the last clear_trace() (empty unless options.trace).
  std::vector<TensorParallelEvent> trace() const;
  void clear_trace();
  /// Sum of per-token cross-entropy over valid labels of the logits the model returns: computed on
  /// the vocab shards without gathering them under loss parallel, plain otherwise.
  at::Tensor cross_entropy_sum(const at::Tensor& logits,         // (B, S, V) or (B, S, V/tp)
                               const at::Tensor& labels) const;  // (B, S) int64, -100 = skip

 private:
  friend std::unique_ptr<TensorParallel> detail::apply_tensor_parallel(torch::nn::Module&, const dist::Mesh&,
                                                                       const TensorParallelPlan&);
  explicit TensorParallel(std::unique_ptr<detail::TensorParallelState> state);
  std::unique_ptr<detail::TensorParallelState> state_;
};

namespace detail {
/// Checks plan against model before anything changes: every path names a module of the kind its
/// style needs, and every split divides by degree. Errors name the path.
void validate_tensor_parallel(const torch::nn::Module& model, const TensorParallelPlan& plan, int64_t degree);
/// Applies a validated plan over the mesh's tp axis (parallelize() calls it; tp > 1).
std::unique_ptr<TensorParallel> apply_tensor_parallel(torch::nn::Module& model, const dist::Mesh& mesh,
                                                      const TensorParallelPlan& plan);
}  // namespace detail

/// Loss parallel: sum over valid labels of the cross-entropy of logits split along the vocabulary
/// over group (this rank holds columns [vocab_offset, vocab_offset + V/tp)). Never materialises the
/// whole vocabulary: three all-reduces of (B*S) values (max, sum of exponentials, target logit).
at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& logits,  // (B, S, V/tp)
                                            const at::Tensor& labels,  // (B, S) int64, -100 = skip
                                            const dist::ProcessGroup& group, int64_t vocab_offset);

}  // namespace titan::parallel
