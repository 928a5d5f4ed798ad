// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/split_backward.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <utility>

#include "titan/core/error.hpp"

namespace titan::nn {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

thread_local std::shared_ptr<WeightGradQueue> recording_;

// Stands in for an op's backward node (`inner`, which keeps its saved tensors and its formulas) with the
// op's edges. Which gradients inner computes follows its edges (a node computes the outputs whose edge is
// valid, or that the graph task needs), so the wrapper hands it the edges of what to compute now: all of
// them in a plain backward, all but the weight's in the queue's input pass, only the weight's in the
// weight pass. The formulas, hence the bits, are the op's own in all three.
struct DeferrableBackward : Node {
  DeferrableBackward(std::shared_ptr<Node> inner, size_t weight_input, std::shared_ptr<WeightGradQueue> queue)
      : inner_(std::move(inner)), weight_input_(weight_input), queue_(std::move(queue)) {}

  variable_list apply(variable_list&& grads) override {
    const bool defer = queue_->deferring() && task_should_compute_output(weight_input_);
    edge_list edges = next_edges();
    if (defer) edges[weight_input_] = Edge();
    inner_->set_next_edges(std::move(edges));
    const at::Tensor output_grad = grads.empty() ? at::Tensor() : grads[0];
    variable_list out = (*inner_)(std::move(grads));
    if (defer && output_grad.defined()) {
      const Edge& weight = next_edge(weight_input_);
      queue_->defer({.node = inner_,
                     .output_grad = output_grad,
                     .weight_input = weight_input_,
                     .target = weight.function,
                     .target_input = weight.input_nr});
      deferred_ = true;
    }
    return out;
  }
  std::string name() const override { return "titan::DeferrableBackward(" + inner_->name() + ")"; }
  // A deferred op's saved tensors stay for the weight pass, which releases them.
  void release_variables() override {
    if (!deferred_) inner_->release_variables();
  }

 private:
  std::shared_ptr<Node> inner_;
  size_t weight_input_;
  std::shared_ptr<WeightGradQueue> queue_;
  bool deferred_ = false;
};

}  // namespace

size_t WeightGradQueue::run_weight_grads() {
  TITAN_CHECK(!deferring_,
              "[titan::nn::WeightGradQueue] expected the weight pass after the input pass, got it inside it. Close "
              "the InputGradPass first.");
  const at::NoGradGuard no_grad;
  edge_list roots;
  variable_list grads;
  roots.reserve(deferred_.size());
  grads.reserve(deferred_.size());
  for (Deferred& d : deferred_) {
    // Only the weight's edge valid: the node computes the weight's gradient and nothing else.
    edge_list edges(d.node->num_outputs());
    edges[d.weight_input] = Edge(d.target, d.target_input);
    d.node->set_next_edges(std::move(edges));
    variable_list out = (*d.node)({d.output_grad});
    d.node->release_variables();
    roots.push_back(Edge(std::move(d.target), d.target_input));
    grads.push_back(std::move(out[d.weight_input]));
  }
  const size_t ran = deferred_.size();
  deferred_.clear();
  // One pass from every weight edge, in the order the ops deferred: a cast or FSDP's gradient node that
  // several ops feed sums their gradients in that order, as the plain backward's input buffer does; the
  // engine checks each gradient against its edge (shape, dtype) as it would the op's output.
  if (!roots.empty()) {
    torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                          /*accumulate_grad=*/true);
  }
  return ran;
}

WeightGradScope::WeightGradScope(std::shared_ptr<WeightGradQueue> queue) : previous_(std::move(recording_)) {
  recording_ = std::move(queue);
}

WeightGradScope::~WeightGradScope() { recording_ = std::move(previous_); }

std::shared_ptr<WeightGradQueue> recording_weight_grads() { return recording_; }

at::Tensor defer_weight_grad(const at::Tensor& y, size_t weight_input) {
  if (recording_ == nullptr || !c10::GradMode::is_enabled() || !y.requires_grad()) return y;
  std::shared_ptr<Node> inner = y.grad_fn();
  TITAN_CHECK(inner != nullptr && y.output_nr() == 0 && inner->num_inputs() == 1,
              "[titan::nn::defer_weight_grad] expected the fresh output of one op, got a tensor whose backward node "
              "({}) has {} inputs. Pass the op's own result.",
              inner ? inner->name() : "none", inner ? inner->num_inputs() : 0);
  if (weight_input >= inner->num_outputs() || !inner->next_edge(weight_input).is_valid()) return y;
  auto node = std::shared_ptr<DeferrableBackward>(new DeferrableBackward(inner, weight_input, recording_),
                                                  torch::autograd::deleteNode);
  node->set_next_edges(edge_list(inner->next_edges()));
  at::Tensor out = y;
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace titan::nn
