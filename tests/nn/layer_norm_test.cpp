// SPDX-License-Identifier: BSD-3-Clause
// nn::LayerNorm against LayerNorm written out in ATen ops, in double: (x - mean) / sqrt(biased var + eps) * w + b,
// forward and every gradient; without a bias; in bf16 (fp32 statistics, one bf16 rounding of the output); and its
// reset to torch.nn.LayerNorm's ones and zeros.
#include <ATen/ATen.h>

#include "test_util.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace layer_norm_test {

using namespace titan;

namespace {

constexpr int64_t kDim = 12;
constexpr double kEps = 1e-5;

at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {  // (..., D) -> (..., D)
  const at::Tensor mean = x.mean({-1}, /*keepdim=*/true);
  const at::Tensor var = (x - mean).pow(2).mean({-1}, /*keepdim=*/true);
  const at::Tensor y = (x - mean) / at::sqrt(var + kEps) * w;
  return b.defined() ? y + b : y;
}

}  // namespace

TEST_CASE("LayerNorm equals its ATen reference forward and backward, with and without a bias", "[nn][layer_norm]") {
  const bool bias = GENERATE(true, false);
  INFO("bias " << bias);
  nn::LayerNorm norm(kDim, kEps, at::TensorOptions(), bias);
  CHECK(norm.bias.defined() == bias);
  CHECK(norm.parameters().size() == (bias ? 2U : 1U));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  {
    at::NoGradGuard no_grad;
    norm.weight.copy_(at::randn({kDim}, gen));
    if (bias) norm.bias.copy_(at::randn({kDim}, gen));
  }
  const at::Tensor x = at::randn({3, 5, kDim}, gen).mul_(2).add_(0.5).requires_grad_();  // (B, S, D)
  const at::Tensor w_out = at::randn({3, 5, kDim}, gen);                                 // weights of the loss
  (norm.forward(x) * w_out).sum().backward();

  const at::Tensor x64 = x.detach().to(at::kDouble).requires_grad_();
  const at::Tensor w64 = norm.weight.detach().to(at::kDouble).requires_grad_();
  const at::Tensor b64 = bias ? norm.bias.detach().to(at::kDouble).requires_grad_() : at::Tensor();
  const at::Tensor want = reference(x64, w64, b64);
  (want * w_out.to(at::kDouble)).sum().backward();

  CHECK(at::allclose(norm.forward(x).to(at::kDouble), want, 1e-5, 1e-6));
  CHECK(at::allclose(x.grad().to(at::kDouble), x64.grad(), 1e-4, 1e-5));
  CHECK(at::allclose(norm.weight.grad().to(at::kDouble), w64.grad(), 1e-4, 1e-5));
  if (bias) CHECK(at::allclose(norm.bias.grad().to(at::kDouble), b64.grad(), 1e-4, 1e-5));
}

TEST_CASE("LayerNorm in bf16 keeps fp32 statistics and resets to ones and zeros", "[nn][layer_norm]") {
  nn::LayerNorm norm(kDim, kEps, at::TensorOptions().dtype(at::kBFloat16));
  norm.reset_parameters();
  CHECK(at::equal(norm.weight, at::ones({kDim}, at::kBFloat16)));
  CHECK(at::equal(norm.bias, at::zeros({kDim}, at::kBFloat16)));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  // A large offset: statistics in bf16 would lose the deviations (bf16 keeps ~3 significant digits).
  const at::Tensor x = (at::randn({4, kDim}, gen) + 300.0).to(at::kBFloat16);  // (B, D)
  const at::Tensor y = norm.forward(x);
  CHECK(y.scalar_type() == at::kBFloat16);
  const at::Tensor want = reference(x.to(at::kDouble), at::ones({kDim}, at::kDouble), at::zeros({kDim}, at::kDouble));
  // One bf16 rounding of values of size ~2: 2^-8 relative.
  CHECK(at::allclose(y.to(at::kDouble), want, 1e-2, 1e-2));
}

}  // namespace layer_norm_test
