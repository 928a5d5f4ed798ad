// SPDX-License-Identifier: BSD-3-Clause
// The widened bf16 GEMM (nn/bf16_gemm.hpp) against its plain reference: the fp64 product of the same bf16
// values, rounded to bf16. The widened product, its two gradients and ATen's own bf16 mm each agree with
// that reference to within one bf16 ulp: every product of two bf16 values is exact in
// fp32, so the only differences left are the order of the fp32 sums (relative ~1e-6 here) deciding a
// rounding at a tie. The tests set the choice themselves, so they run the widened path on every CPU.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <array>
#include <map>

#include "dist/rank_test_util.hpp"
#include "nn/bf16_gemm_scope.hpp"
#include "test_util.hpp"
#include "titan/core/cpu_info.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/nn/saved_ops.hpp"
#include "titan/train/step.hpp"

namespace titan::test {
namespace {

/// The reference: the fp64 product of bf16 values, rounded to bf16.
at::Tensor reference_mm(const at::Tensor& a, const at::Tensor& b) {
  return at::mm(a.to(at::kDouble), b.to(at::kDouble)).to(at::kBFloat16);
}

/// Largest |x - ref| in units of 2^-7 |ref|, at least one bf16 ulp of ref (8 significant bits): 1.0 allows
/// the two to be neighbouring bf16 values, as when a tie rounds the other way.
double bf16_steps_from(const at::Tensor& x, const at::Tensor& ref) {
  REQUIRE(x.scalar_type() == at::kBFloat16);
  REQUIRE(x.sizes() == ref.sizes());
  const at::Tensor r = ref.to(at::kDouble);
  const at::Tensor step = r.abs() * (1.0 / 128) + 1e-30;
  return ((x.to(at::kDouble) - r).abs() / step).max().item<double>();
}

std::string grad_fn_name(const at::Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "(none)"; }

}  // namespace

TEST_CASE(
    "bf16 GEMM choice: AMX keeps ATen's kernel, no AVX512-BF16 widens, AVX512-BF16 alone takes the faster, "
    "TITAN_BF16_GEMM overrides",
    "[nn][bf16_gemm]") {
  const CpuInfo amx{.avx2 = true, .avx512 = true, .avx512_bf16 = true, .amx_bf16 = true};
  const CpuInfo avx512_bf16{.avx2 = true, .avx512 = true, .avx512_bf16 = true};
  const CpuInfo avx2{.avx2 = true};
  int timed = 0;
  const auto timing = [&timed](double native_s, double widened_s) {
    return [&timed, native_s, widened_s] {
      ++timed;
      return nn::Bf16GemmTiming{.native_s = native_s, .widened_s = widened_s};
    };
  };
  CHECK(nn::choose_bf16_gemm("", amx, timing(2, 1)) == nn::Bf16Gemm::native);
  CHECK(nn::choose_bf16_gemm("", avx2, timing(1, 2)) == nn::Bf16Gemm::widened);
  CHECK(nn::choose_bf16_gemm("auto", avx2, timing(1, 2)) == nn::Bf16Gemm::widened);
  CHECK(timed == 0);  // neither CPU is timed: the flags decide
  CHECK(nn::choose_bf16_gemm("", avx512_bf16, timing(1, 2.4)) == nn::Bf16Gemm::native);       // Zen 4 measured
  CHECK(nn::choose_bf16_gemm("auto", avx512_bf16, timing(1.7, 1)) == nn::Bf16Gemm::widened);  // Xeon measured
  CHECK(timed == 2);
  CHECK(nn::choose_bf16_gemm("native", avx2, timing(2, 1)) == nn::Bf16Gemm::native);
  CHECK(nn::choose_bf16_gemm("widened", amx, timing(1, 2)) == nn::Bf16Gemm::widened);
  CHECK(timed == 2);  // an explicit setting times nothing
  const std::string error = error_of([&] { nn::choose_bf16_gemm("fast", avx2, timing(1, 1)); });
  CHECK_THAT(error, Catch::Contains("TITAN_BF16_GEMM") && Catch::Contains("'fast'") &&
                        Catch::Contains("auto, native or widened"));
  CHECK_THAT(nn::describe_bf16_gemm(), Catch::Contains("bf16 GEMMs on CPU"));
  // The timing itself: both forms of a real product, each a positive time, and the training's random
  // stream untouched (it is checkpointed and must match across replicas whenever the choice is made).
  at::manual_seed(5);
  const at::Tensor before = at::detail::getDefaultCPUGenerator().get_state();
  const nn::Bf16GemmTiming measured = nn::time_bf16_gemms(64);
  CHECK(at::equal(at::detail::getDefaultCPUGenerator().get_state(), before));
  CHECK(measured.n == 64);
  CHECK(measured.native_s > 0);
  CHECK(measured.widened_s > 0);
}

TEST_CASE(
    "widened bf16 mm: product and both gradients within one bf16 rounding of the fp64 reference, as "
    "ATen's bf16 mm",
    "[nn][bf16_gemm]") {
  at::manual_seed(0);
  // Odd sizes and a transposed right operand (a Linear's w.t()), K long enough for sums to round.
  const at::Tensor a = at::randn({37, 301}).to(at::kBFloat16).requires_grad_(true);  // (M, K)
  const at::Tensor w = at::randn({29, 301}).to(at::kBFloat16).requires_grad_(true);  // (N, K)
  const at::Tensor b = w.t();                                                        // (K, N) view
  const at::Tensor g = at::randn({37, 29}).to(at::kBFloat16);                        // (M, N)

  const at::Tensor out = nn::widened_mm(a, b);  // (M, N)
  CHECK(grad_fn_name(out) == "titan::WidenedMmBackward");
  const at::Tensor ref = reference_mm(a.detach(), b.detach());
  CHECK(bf16_steps_from(out, ref) <= 1.0);
  CHECK(bf16_steps_from(at::mm(a.detach(), b.detach()), ref) <= 1.0);  // ATen's bf16 kernel: the same bound

  // The gradient reaching the weight is laid out as the weight is (ATen's mm backward does the same), so
  // AccumulateGrad keeps it without a copy.
  bool weight_grad_contiguous = false;
  w.register_hook([&](const at::Tensor& grad) { weight_grad_contiguous = grad.is_contiguous(); });
  out.backward(g);
  CHECK(weight_grad_contiguous);
  REQUIRE(a.grad().defined());
  REQUIRE(w.grad().defined());
  CHECK(bf16_steps_from(a.grad(), reference_mm(g, b.detach().t())) <= 1.0);  // dA = g B^T
  CHECK(bf16_steps_from(w.grad(), reference_mm(g.t(), a.detach())) <= 1.0);  // dW = (A^T g)^T = g^T A
  CHECK_THAT(error_of([&] { nn::widened_mm(a.detach().to(at::kFloat), b.detach()); }),
             Catch::Contains("titan::nn::widened_mm") && Catch::Contains("Float"));
}

TEST_CASE("nn::mm follows the choice: widened or ATen's kernel for bf16, at::mm for everything else",
          "[nn][bf16_gemm]") {
  const at::Tensor a = at::randn({8, 16}).to(at::kBFloat16).requires_grad_(true);  // (M, K)
  const at::Tensor b = at::randn({16, 4}).to(at::kBFloat16).requires_grad_(true);  // (K, N)
  {
    const Bf16GemmScope widened(nn::Bf16Gemm::widened);
    CHECK(nn::widens(a, b));
    CHECK_FALSE(nn::bf16_gemms_at_bf16_rate(at::Device(at::kCPU)));  // MFU against the fp32 peak
    CHECK(grad_fn_name(nn::mm(a, b)) == "titan::WidenedMmBackward");
    CHECK_FALSE(nn::widens(a.detach().to(at::kFloat), b.detach().to(at::kFloat)));
    CHECK(grad_fn_name(nn::mm(a.to(at::kFloat), b.to(at::kFloat))) == "MmBackward0");
  }
  const Bf16GemmScope native(nn::Bf16Gemm::native);
  CHECK_FALSE(nn::widens(a, b));
  CHECK(nn::bf16_gemms_at_bf16_rate(at::Device(at::kCPU)));
  CHECK(grad_fn_name(nn::mm(a, b)) == "MmBackward0");
}

TEST_CASE("nn::linear under CPU bf16 autocast: widened and native give one bf16 linear, fp32 master gradients",
          "[nn][bf16_gemm]") {
  at::manual_seed(1);
  const at::Tensor x = at::randn({2, 5, 64}).requires_grad_(true);  // (B, S, in) fp32
  const at::Tensor w = at::randn({48, 64}).requires_grad_(true);    // (out, in) fp32 master weight
  const at::Tensor g = at::randn({2, 5, 48}).to(at::kBFloat16);     // (B, S, out)
  std::map<nn::Bf16Gemm, std::array<at::Tensor, 3>> runs;           // output, dx, dw per choice
  for (const nn::Bf16Gemm choice : {nn::Bf16Gemm::widened, nn::Bf16Gemm::native}) {
    const Bf16GemmScope scope(choice);
    at::Tensor y;  // (B, S, out)
    {
      const AutocastScope autocast(true, at::kCPU);
      y = nn::linear(x, w, nullptr);
    }
    CHECK(y.scalar_type() == at::kBFloat16);
    y.backward(g);
    CHECK(x.grad().scalar_type() == at::kFloat);
    CHECK(w.grad().scalar_type() == at::kFloat);
    runs[choice] = {y.detach(), x.grad().clone(), w.grad().clone()};
    x.grad().zero_();
    w.grad().zero_();
  }
  const at::Tensor x16 = x.detach().to(at::kBFloat16).reshape({10, 64});  // (M, in)
  const at::Tensor w16 = w.detach().to(at::kBFloat16);                    // (out, in)
  const at::Tensor g2 = g.reshape({10, 48});                              // (M, out)
  for (const auto& [choice, run] : runs) {
    INFO((choice == nn::Bf16Gemm::widened ? "widened" : "native"));
    CHECK(bf16_steps_from(run[0].reshape({10, 48}), reference_mm(x16, w16.t())) <= 1.0);
    CHECK(bf16_steps_from(run[1].reshape({10, 64}).to(at::kBFloat16), reference_mm(g2, w16)) <= 1.0);
    CHECK(bf16_steps_from(run[2].to(at::kBFloat16), reference_mm(g2.t(), x16)) <= 1.0);
  }
}

}  // namespace titan::test

namespace titan::test {

TEST_CASE("bf16 GEMM choice: every rank takes rank 0's, whatever its own timing said", "[nn][bf16_gemm][dist]") {
  for (const auto rank0 : {nn::Bf16Gemm::native, nn::Bf16Gemm::widened}) {
    const auto other = rank0 == nn::Bf16Gemm::native ? nn::Bf16Gemm::widened : nn::Bf16Gemm::native;
    dist::run_local_ranks(3, [&](int64_t rank, const dist::Store& store) {
      const dist::Mesh mesh({.dp_shard = 3}, rank, store, mesh_options());
      const nn::Bf16Gemm agreed = nn::agree_bf16_gemm(mesh.group("world"), rank == 0 ? rank0 : other);
      RANK_CHECK(agreed == rank0);
    });
  }
  CHECK(nn::agree_bf16_gemm(dist::Mesh().group("world"), nn::Bf16Gemm::widened) == nn::Bf16Gemm::widened);
  // One process: nothing to agree on, the choice stays.
  const nn::Bf16Gemm before = nn::bf16_gemm();
  CHECK_FALSE(nn::use_rank0_bf16_gemm(dist::Mesh().group("world")));
  CHECK(nn::bf16_gemm() == before);
}

}  // namespace titan::test
