// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/init.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

namespace titan::nn {
namespace {
double norm_cdf(double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; }
}  // namespace

void trunc_normal_(at::Tensor& t, double mean, double std, double a, double b) {
  at::NoGradGuard no_grad;
  // Same sequence of ops as torch.nn.init._no_grad_trunc_normal_, so a seed gives the same weights.
  const double l = norm_cdf((a - mean) / std);
  const double u = norm_cdf((b - mean) / std);
  t.uniform_(2 * l - 1, 2 * u - 1);
  t.erfinv_();
  t.mul_(std * std::sqrt(2.0));
  t.add_(mean);
  t.clamp_(a, b);
}

void normal_(at::Tensor& t, double mean, double std) {
  at::NoGradGuard no_grad;
  t.normal_(mean, std);
}

}  // namespace titan::nn
