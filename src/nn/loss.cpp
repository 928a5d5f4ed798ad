// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/loss.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "cross_entropy_kernel.hpp"
#include "titan/core/detail/cpu_dispatch.hpp"
#include "titan/core/error.hpp"
#include "titan/nn/detail/fused_cross_entropy.hpp"

namespace titan {
namespace {

using torch::autograd::variable_list;

struct Kernels {
  void (*forward)(const detail::CrossEntropyRows&);
  void (*backward)(const detail::CrossEntropyRows&);
};

Kernels kernels(std::string_view build) {
  if (build == "avx2") return {detail::cross_entropy_forward_avx2, detail::cross_entropy_backward_avx2};
  return {detail::cross_entropy_forward_default, detail::cross_entropy_backward_default};
}

/// The widest build this CPU runs (ATen's runtime dispatch idea, without its registry).
std::string_view widest_build() { return detail::cpu_runs_avx2() ? "avx2" : "default"; }

// A label must name a logit or be ignored; ATen's twin refuses the same labels.
void check_labels(const at::Tensor& labels, int64_t vocab) {
  const at::Tensor bad = labels.ne(kIgnoreIndex).logical_and(labels.lt(0).logical_or(labels.ge(vocab)));  // (N)
  if (!bad.any().item<bool>()) return;
  const int64_t at_token = bad.nonzero()[0][0].item<int64_t>();
  TITAN_CHECK_VALUE(false,
                    "[titan::cross_entropy_sum] expected labels in [0, {}) or {} (ignored), got {} at token {}. "
                    "The labels come from a tokenizer whose vocabulary is larger than model.vocab_size: "
                    "match the two.",
                    vocab, kIgnoreIndex, labels[at_token].item<int64_t>(), at_token);
}

// shift: (2, N) fp32, each row's max and the log of its shifted sum of exponentials.
detail::CrossEntropyRows rows_of(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& shift) {
  return {.logits = logits.const_data_ptr(),
          .bf16 = logits.scalar_type() == at::kBFloat16,
          .labels = labels.const_data_ptr<int64_t>(),
          .rows = logits.size(0),
          .vocab = logits.size(1),
          .ignore_index = kIgnoreIndex,
          .row_max = shift[0].mutable_data_ptr<float>(),
          .log_sum = shift[1].mutable_data_ptr<float>()};
}

// The loss's backward: the softmax of each row minus the label's one-hot, times the loss's gradient,
// written in the logits' dtype by the kernel.
struct FusedCrossEntropyBackward : torch::autograd::Node {
  FusedCrossEntropyBackward(at::Tensor logits, at::Tensor labels, at::Tensor shift, std::vector<int64_t> shape,
                            Kernels kernels)
      : logits_(std::move(logits)),
        labels_(std::move(labels)),
        shift_(std::move(shift)),
        shape_(std::move(shape)),
        kernels_(kernels) {}

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    const at::Tensor grad = at::empty(logits_.sizes(), logits_.options());  // (N, V) like the logits
    detail::CrossEntropyRows rows = rows_of(logits_, labels_, shift_);
    rows.grad_scale = grads[0].to(at::kFloat).item<float>();
    rows.grad = grad.mutable_data_ptr();
    kernels_.backward(rows);
    return {grad.view(shape_)};
  }
  std::string name() const override { return "titan::FusedCrossEntropyBackward"; }
  void release_variables() override {
    logits_.reset();
    labels_.reset();
    shift_.reset();
  }

 private:
  at::Tensor logits_;           // (N, V) float or bf16, detached
  at::Tensor labels_;           // (N) int64
  at::Tensor shift_;            // (2, N) fp32: each row's max, log of its shifted sum
  std::vector<int64_t> shape_;  // the logits' own shape, (B, S, V)
  Kernels kernels_;
};

at::Tensor fused_sum(const at::Tensor& logits, const at::Tensor& labels, Kernels k) {
  TITAN_CHECK_VALUE(logits.dim() >= 2 && labels.numel() * logits.size(-1) == logits.numel(),
                    "[titan::cross_entropy_sum] expected logits (B, S, V) and labels (B, S), got {} and {}.",
                    c10::str(logits.sizes()), c10::str(labels.sizes()));
  const at::Tensor flat = logits.detach().view({-1, logits.size(-1)});         // (N, V)
  const at::Tensor targets = labels.reshape({-1}).to(at::kLong).contiguous();  // (N)
  check_labels(targets, flat.size(1));
  const at::Tensor shift = at::empty({2, flat.size(0)}, flat.options().dtype(at::kFloat));  // (2, N)
  const at::Tensor row_loss = at::empty({flat.size(0)}, flat.options().dtype(at::kFloat));  // (N)
  detail::CrossEntropyRows rows = rows_of(flat, targets, shift);
  rows.row_loss = row_loss.mutable_data_ptr<float>();
  k.forward(rows);
  // The rows' sum in double, then fp32: the twin's dtype, with less rounding than its fp32 sum.
  at::Tensor loss = row_loss.sum(at::kDouble).to(at::kFloat);  // ()
  if (at::GradMode::is_enabled() && logits.requires_grad()) {
    auto node = std::shared_ptr<FusedCrossEntropyBackward>(
        new FusedCrossEntropyBackward(flat, targets, shift, logits.sizes().vec(), k), torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(logits));
    torch::autograd::set_history(loss, node);
  }
  return loss;
}

}  // namespace

at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) {
  if (!detail::fused_cross_entropy_runs(logits)) return cross_entropy_sum_reference(logits, labels);
  return fused_sum(logits, labels, kernels(widest_build()));
}

at::Tensor cross_entropy_sum_reference(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor flat = logits.flatten(0, 1).to(at::kFloat);  // (B*S, V) fp32 for a stable log-softmax
  return at::cross_entropy_loss(flat, labels.flatten(), /*weight=*/std::nullopt, at::Reduction::Sum, kIgnoreIndex);
}

int64_t count_valid_tokens(const at::Tensor& labels) { return labels.ne(kIgnoreIndex).sum().item<int64_t>(); }

namespace detail {

bool fused_cross_entropy_runs(const at::Tensor& logits) {
  return logits.defined() && logits.device().is_cpu() && logits.dim() >= 2 && logits.is_contiguous() &&
         (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16) && logits.numel() > 0;
}

std::vector<std::string> fused_cross_entropy_builds() { return cpu_runnable_builds(); }

at::Tensor fused_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels, std::string_view build) {
  TITAN_CHECK_VALUE(fused_cross_entropy_runs(logits),
                    "[titan::detail::fused_cross_entropy_sum] expected contiguous float or bf16 CPU logits, got {} "
                    "{} on {}. Use cross_entropy_sum, which falls back to the ATen twin.",
                    c10::toString(logits.scalar_type()), c10::str(logits.sizes()), logits.device().str());
  TITAN_CHECK_VALUE(build == "default" || (build == "avx2" && cpu_runs_avx2()),
                    "[titan::detail::fused_cross_entropy_sum] expected a build this CPU runs (default{}), got '{}'.",
                    cpu_runs_avx2() ? ", avx2" : "", build);
  return fused_sum(logits, labels, kernels(build));
}

}  // namespace detail
}  // namespace titan
