// SPDX-License-Identifier: BSD-3-Clause
// Split backward (zero-bubble pipelines' 'I' and 'W' passes) inside titan's layers. A layer op with a
// weight — the Linear's matmul, the grouped experts' GEMMs, the RMSNorm's scale — hands its output to
// defer_weight_grad(). While a WeightGradScope is open on the thread that runs the forward (the pipeline
// runtime opens one per (stage, microbatch) forward of a split schedule), that output's backward node is
// wrapped so it can leave the weight's gradient for later: during the queue's input pass it computes only
// the input gradient, with the op's own backward formula, and records the op, its output gradient and the
// weight's autograd edge in the queue; run_weight_grads() then computes every recorded weight gradient
// with the same formula and hands them to autograd at the weights' edges, so casts, FSDP's gradient
// reduction and accumulation into .grad happen as in the plain backward (bitwise the same gradients). Out
// of the input pass (a plain backward of the same graph) the wrapped node computes both, as before.
//
// What cannot defer computes its weight gradient in the input pass: Embedding, biases, float8 Linears (a
// converter's matmul), the experts' loop path, RMSNorm off CPU or under autocast.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
struct Edge;
}  // namespace torch::autograd

namespace titan::nn {

/// The weight gradients one (stage, microbatch)'s backward left for its weight pass.
class WeightGradQueue : public std::enable_shared_from_this<WeightGradQueue> {
 public:
  /// One deferred op: its backward node (saved tensors kept), the gradient of its output, which
  /// input is the weight, and where that input's gradient goes.
  struct Deferred {
    std::shared_ptr<torch::autograd::Node> node{};    ///< the op's own backward node
    at::Tensor output_grad{};                         ///< gradient of the op's output
    size_t weight_input = 0;                          ///< the weight's input index of the op
    std::shared_ptr<torch::autograd::Node> target{};  ///< the weight's gradient edge: its node ...
    uint32_t target_input = 0;                        ///< ... and that node's input
  };

  /// Whether wrapped ops defer their weight gradient now (set by InputGradPass).
  bool deferring() const { return deferring_; }
  /// Ops deferred and not yet run.
  size_t size() const { return deferred_.size(); }
  /// Appends one op (called by the wrapped backward nodes).
  void defer(Deferred d) { deferred_.push_back(std::move(d)); }
  /// The weight pass: computes every deferred weight gradient in the order the ops deferred them and
  /// runs them into the weights' edges in one autograd pass (accumulating into .grad). Returns how
  /// many ops ran.
  size_t run_weight_grads();

 private:
  friend class InputGradPass;
  bool deferring_ = false;
  std::vector<Deferred> deferred_{};
};

/// While alive, `queue` defers the weight gradients of the wrapped ops its backward meets (the
/// zero-bubble 'I' pass); the previous state is restored after.
class InputGradPass {
 public:
  explicit InputGradPass(WeightGradQueue& queue) : queue_(queue), was_(queue.deferring_) { queue.deferring_ = true; }
  ~InputGradPass() { queue_.deferring_ = was_; }
  InputGradPass(const InputGradPass&) = delete;
  InputGradPass& operator=(const InputGradPass&) = delete;

 private:
  WeightGradQueue& queue_;
  bool was_;
};

/// While alive, the deferrable ops this thread's forward runs wrap their backward for `queue`
/// (nullptr: none; e.g. a checkpoint's recompute outside a split schedule).
class WeightGradScope {
 public:
  explicit WeightGradScope(std::shared_ptr<WeightGradQueue> queue);
  ~WeightGradScope();
  WeightGradScope(const WeightGradScope&) = delete;
  WeightGradScope& operator=(const WeightGradScope&) = delete;

 private:
  std::shared_ptr<WeightGradQueue> previous_;
};

/// The queue the running forward records for (null outside a WeightGradScope): what a checkpoint
/// captures to reopen the scope in its recompute.
std::shared_ptr<WeightGradQueue> recording_weight_grads();

/// y (the fresh output of one differentiable op whose input `weight_input` is a weight), with its
/// backward made deferrable for the recording queue; y unchanged outside a WeightGradScope, under
/// no-grad, or when the weight needs no gradient.
at::Tensor defer_weight_grad(const at::Tensor& y, size_t weight_input);

}  // namespace titan::nn
