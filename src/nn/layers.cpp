// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/layers.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace titan::nn {

Linear::Linear(int64_t in_features, int64_t out_features, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({out_features, in_features}, options));
}

at::Tensor Linear::forward(const at::Tensor& x) const { return at::linear(x, weight); }

Embedding::Embedding(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({num_embeddings, dim}, options));
}

at::Tensor Embedding::forward(const at::Tensor& tokens) const { return at::embedding(weight, tokens); }

RMSNorm::RMSNorm(int64_t dim, double eps_, const at::TensorOptions& options) : eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  // at::rms_norm accumulates in fp32 for bf16 input (torchtitan's nn.RMSNorm numerics), with the
  // weight applied in the same op.
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

void RMSNorm::reset_parameters() {
  at::NoGradGuard no_grad;
  weight.fill_(1.0);
}

}  // namespace titan::nn
