// SPDX-License-Identifier: BSD-3-Clause
// The MoE grouped GEMM's CUDA path (bf16 operands, expert groups padded to 16-byte aligned rows) against
// the per-expert loop on CPU with the same bf16 casts: values and gradients within bf16 rounding, the
// input dtype kept, an empty expert's weight gradient exactly zero, and no device-to-host sync.
// tests/nn/moe_test.cpp proves the padded layout itself on CPU, bit for bit against a per-expert loop.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/autograd.h>
#include <catch2/catch.hpp>

#include <vector>

#include "titan/nn/moe.hpp"

namespace nn = titan::nn;

namespace {

// ||got - want|| / ||want||, both moved to the CPU in fp32.
double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.cpu().to(at::kFloat);   // (...)
  const at::Tensor w = want.cpu().to(at::kFloat);  // (...)
  return (g - w).norm().item<double>() / w.norm().item<double>();
}

}  // namespace

TEST_CASE("moe grouped GEMM (CUDA): bf16 on padded groups equals the CPU per-expert loop within rounding",
          "[nn][moe][cuda]") {
  at::manual_seed(7);
  const int64_t E = 4, D = 64, F = 128, N = 56;
  const at::Device cuda(at::kCUDA);
  const std::vector<std::vector<int64_t>> cases = {{13, 0, 40, 3}, {0, N, 0, 0}, {N, 0, 0, 0}};
  for (const auto& c : cases) {
    at::Tensor counts = at::tensor(c, at::kLong);      // (E)
    const at::Tensor x = at::randn({N, D});            // (N, D) fp32
    const at::Tensor w1 = at::randn({E, F, D}) * 0.1;  // (E, F, D)
    const at::Tensor w2 = at::randn({E, D, F}) * 0.1;  // (E, D, F)
    const at::Tensor w3 = at::randn({E, F, D}) * 0.1;  // (E, F, D)
    const at::Tensor dy = at::randn({N, D});           // (N, D)
    std::vector<at::Tensor> gpu{x.to(cuda).requires_grad_(true), w1.to(cuda).requires_grad_(true),
                                w2.to(cuda).requires_grad_(true), w3.to(cuda).requires_grad_(true)};
    std::vector<at::Tensor> cpu{x.clone().requires_grad_(true), w1.clone().requires_grad_(true),
                                w2.clone().requires_grad_(true), w3.clone().requires_grad_(true)};
    at::Tensor y = nn::experts_grouped_mm(gpu[0], gpu[1], gpu[2], gpu[3], counts.to(cuda));  // (N, D) fp32
    const auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
    at::Tensor ref =
        nn::experts_loop(bf16(cpu[0]), bf16(cpu[1]), bf16(cpu[2]), bf16(cpu[3]), counts).to(at::kFloat);  // (N, D)
    INFO("counts " << counts);
    REQUIRE(y.scalar_type() == at::kFloat);
    REQUIRE(y.sizes() == ref.sizes());
    CHECK(relative_error(y, ref) < 1e-2);
    const auto g = torch::autograd::grad({y}, gpu, {dy.to(cuda)});
    const auto r = torch::autograd::grad({ref}, cpu, {dy});
    for (size_t i = 0; i < g.size(); ++i) {
      INFO("gradient " << i);
      CHECK(g[i].scalar_type() == at::kFloat);
      CHECK(relative_error(g[i], r[i]) < 2e-2);
    }
    for (int64_t e = 0; e < E; ++e) {
      if (c[static_cast<size_t>(e)] == 0) CHECK(g[1][e].abs().max().item<float>() == 0.f);  // an all-padding group
    }
  }
}

TEST_CASE("moe grouped GEMM (CUDA): no device-to-host sync", "[nn][moe][cuda]") {
  at::manual_seed(8);
  const int64_t E = 4, D = 64, F = 128, N = 56;
  const at::TensorOptions on_gpu = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({N, D}, on_gpu);                                 // (N, D)
  const at::Tensor w1 = at::randn({E, F, D}, on_gpu);                             // (E, F, D)
  const at::Tensor w2 = at::randn({E, D, F}, on_gpu);                             // (E, D, F)
  const at::Tensor w3 = at::randn({E, F, D}, on_gpu);                             // (E, F, D)
  const at::Tensor counts = at::tensor({13, 0, 40, 3}, at::kLong).to(at::kCUDA);  // (E)
  // Routing leaves the counts on the device; reading them back would stall every MoE layer's forward.
  auto& state = c10::cuda::warning_state();
  const c10::cuda::SyncDebugMode was = state.get_sync_debug_mode();
  state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  at::Tensor y;  // (N, D)
  CHECK_NOTHROW(y = nn::experts_grouped_mm(x, w1, w2, w3, counts));
  state.set_sync_debug_mode(was);
  CHECK(y.defined());
}
