// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/detail/state_passing.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <utility>

#include "titan/dist/process_group.hpp"

namespace titan::nn::detail {
namespace {

using torch::autograd::variable_list;

// Gloo matches a pair's messages by tag; each direction carries one kind of message, in layer order.
constexpr int64_t kCarryTag = 7301;

// The received carry's gradient goes back to the rank that sent it.
struct ReceiveCarryBackward : torch::autograd::Node {
  ReceiveCarryBackward(dist::ProcessGroup group, int64_t numel, at::TensorOptions options)
      : group_(std::move(group)), numel_(numel), options_(options) {}
  variable_list apply(variable_list&& grads) override {
    at::NoGradGuard no_grad;
    // Zeros where no gradient reached the carry: the sender waits for a message either way.
    const at::Tensor grad = grads[0].defined() ? grads[0].contiguous() : at::zeros({numel_}, options_);  // (numel)
    group_.send(grad, group_.rank() - 1, kCarryTag).wait();
    return {at::Tensor()};  // the anchor's gradient: none
  }
  std::string name() const override { return "titan::nn::ReceiveCarryBackward"; }

 private:
  dist::ProcessGroup group_;
  int64_t numel_;
  at::TensorOptions options_;
};

// out passes through; the sent carry's gradient arrives from the rank that received it.
struct SendCarryBackward : torch::autograd::Node {
  SendCarryBackward(dist::ProcessGroup group, int64_t numel, at::TensorOptions options)
      : group_(std::move(group)), numel_(numel), options_(options) {}
  variable_list apply(variable_list&& grads) override {
    at::NoGradGuard no_grad;
    at::Tensor carry = at::empty({numel_}, options_);  // (numel)
    group_.recv(carry, group_.rank() + 1, kCarryTag).wait();
    return {grads[0], carry};
  }
  std::string name() const override { return "titan::nn::SendCarryBackward"; }

 private:
  dist::ProcessGroup group_;
  int64_t numel_;
  at::TensorOptions options_;
};

}  // namespace

at::Tensor receive_from_previous(const dist::ProcessGroup& group, int64_t numel, const at::TensorOptions& options,
                                 const at::Tensor& anchor, bool differentiable) {
  at::Tensor carry = at::zeros({numel}, options.device(group.device()));  // (numel)
  if (group.rank() == 0) return carry;
  group.recv(carry, group.rank() - 1, kCarryTag).wait();
  if (differentiable) {
    auto node = std::shared_ptr<ReceiveCarryBackward>(new ReceiveCarryBackward(group, numel, carry.options()),
                                                      torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(anchor));
    torch::autograd::set_history(carry, node);
  }
  return carry;
}

at::Tensor send_to_next(const at::Tensor& out, const at::Tensor& carry, const dist::ProcessGroup& group,
                        bool differentiable) {
  if (group.rank() == group.size() - 1) return out;
  {
    const at::Tensor message = carry.detach().contiguous();  // (numel)
    group.send(message, group.rank() + 1, kCarryTag).wait();
  }
  if (!differentiable) return out;
  at::Tensor passed;
  {
    at::NoGradGuard no_grad;
    passed = at::empty({0}, out.options()).set_(out);  // an alias that is not an autograd view, for its own grad_fn
  }
  auto node = std::shared_ptr<SendCarryBackward>(new SendCarryBackward(group, carry.numel(), carry.options()),
                                                 torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(out, carry));
  torch::autograd::set_history(passed, node);
  return passed;
}

}  // namespace titan::nn::detail
