// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/clip.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace titan {
namespace {
std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}
}  // namespace

at::Tensor grad_norm(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  const auto grads = defined_grads(params);
  if (grads.empty()) return at::zeros({}, at::kFloat);
  const auto norms = at::_foreach_norm(grads, 2);  // each ()
  return at::linalg_vector_norm(at::stack(norms).to(at::kFloat), 2);
}

double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  const at::Tensor norm = grad_norm(params);
  const double total = norm.item<double>();
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
      auto grads = defined_grads(params);
      at::_foreach_mul_(grads, coef);
    }
  }
  return total;
}

}  // namespace titan
