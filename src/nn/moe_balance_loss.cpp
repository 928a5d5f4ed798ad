// SPDX-License-Identifier: BSD-3-Clause
// DeepSeek-V3's sequence-wise auxiliary balance loss and the node that puts it into the objective from inside
// the MoE layer's forward (nn/moe.hpp: MoEArgs::load_balance_loss_weight).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "titan/core/error.hpp"
#include "titan/nn/moe.hpp"

namespace titan::nn {

at::Tensor sequence_balance_loss(const at::Tensor& scores, const at::Tensor& selected, int64_t batch, double alpha) {
  const int64_t experts = scores.size(1);
  const int64_t k = selected.size(1);
  TITAN_CHECK_VALUE(batch >= 1 && scores.size(0) % batch == 0,
                    "[titan::nn::sequence_balance_loss] expected the {} tokens to split into {} sequences, got a "
                    "remainder. Pass scores of whole (B, S) batches.",
                    scores.size(0), batch);
  const int64_t seq = scores.size(0) / batch;
  at::Tensor f;  // (B, E): E / (K S) * slots of each sequence routed to each expert
  {
    at::NoGradGuard no_grad;
    at::Tensor chosen = at::zeros({scores.size(0), experts}, scores.options());  // (B*S, E)
    chosen.scatter_add_(1, selected, at::ones(selected.sizes(), scores.options()));
    f = chosen.view({batch, seq, experts}).sum(1) * (static_cast<double>(experts) / static_cast<double>(k * seq));
  }
  at::Tensor normalized = scores / scores.sum(-1, /*keepdim=*/true);  // (B*S, E): s' of eq. 19
  at::Tensor p = normalized.view({batch, seq, experts}).mean(1);      // (B, E): P of eq. 20
  return alpha * (f * p).sum();                                       // ()
}

namespace detail {
namespace {

// Identity on the MoE output whose backward also hands the auxiliary loss its gradient, 1 (torchtitan's
// _AuxLossInjection): the loss joins the objective wherever the output goes, on any pipeline stage.
struct InjectAuxLoss : torch::autograd::Node {
  explicit InjectAuxLoss(at::TensorOptions aux_options) : aux_options_(aux_options) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    return {std::move(grads[0]), at::ones({}, aux_options_)};
  }
  std::string name() const override { return "titan::nn::InjectAuxLoss"; }

 private:
  at::TensorOptions aux_options_;
};

}  // namespace

at::Tensor inject_aux_loss(const at::Tensor& carrier, const at::Tensor& aux) {
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = at::empty({0}, carrier.options()).set_(carrier);  // an alias with its own autograd history
  }
  auto node = std::shared_ptr<InjectAuxLoss>(new InjectAuxLoss(aux.options()), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(carrier, aux));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace detail

}  // namespace titan::nn
