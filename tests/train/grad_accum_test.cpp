// SPDX-License-Identifier: BSD-3-Clause
// Gradient accumulation: 4 microbatches of 2 give the gradients of one batch of 8, because each
// microbatch's summed loss is divided by the valid tokens of the whole batch (some labels ignored).
#include <ATen/ATen.h>

#include "test_util.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/loss.hpp"
#include "titan/train/step.hpp"

namespace {
std::vector<at::Tensor> grads_for(const std::vector<titan::Microbatch>& micro, double* loss) {
  titan::nn::manual_init_seed(5);
  titan::llama3::Llama3 model({.dim = 64,
                               .n_layers = 2,
                               .n_heads = 4,
                               .n_kv_heads = 2,
                               .vocab_size = 101,
                               .multiple_of = 32,
                               .rope_theta = 500000},
                              16, at::TensorOptions());
  model.init_weights();
  const auto result = titan::forward_backward(
      [&](const at::Tensor& t, const titan::nn::AttentionContext& c) { return model.forward(t, c); }, micro, at::kCPU);
  *loss = result.loss;
  std::vector<at::Tensor> grads;
  for (const auto& p : model.unique_parameters()) grads.push_back(p.grad().clone());
  return grads;
}
}  // namespace

TEST_CASE("4 microbatches of 2 give the gradients of one batch of 8", "[train][grad_accum]") {
  at::manual_seed(17);
  const at::Tensor input = at::randint(0, 101, {8, 16}, at::kLong);  // (B, S)
  at::Tensor labels = at::randint(0, 101, {8, 16}, at::kLong);       // (B, S)
  // Uneven ignored labels per microbatch: a per-microbatch mean would weight them wrongly.
  labels.narrow(0, 0, 1).narrow(1, 0, 11).fill_(titan::kIgnoreIndex);
  labels.narrow(0, 5, 1).narrow(1, 3, 4).fill_(titan::kIgnoreIndex);

  double loss_full = 0;
  double loss_accum = 0;
  const auto full = grads_for({{input, labels}}, &loss_full);
  std::vector<titan::Microbatch> micro;
  for (int64_t i = 0; i < 4; ++i) micro.push_back({input.narrow(0, 2 * i, 2), labels.narrow(0, 2 * i, 2)});
  const auto accum = grads_for(micro, &loss_accum);

  // fp32: only the summation order differs, so agreement to ~1e-6 relative.
  CHECK(loss_accum == Approx(loss_full).epsilon(1e-6));
  REQUIRE(full.size() == accum.size());
  for (size_t i = 0; i < full.size(); ++i) {
    INFO("parameter " << i << " max diff " << (full[i] - accum[i]).abs().max().item<double>());
    CHECK(at::allclose(accum[i], full[i], 1e-5, 1e-7));
  }
  // The loss is the token mean over the valid labels only.
  const int64_t valid = titan::count_valid_tokens(labels);
  CHECK(valid == 8 * 16 - 11 - 4);
}
