// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/bf16_gemm.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <optional>

#include "titan/core/cpu_info.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/process_group.hpp"

namespace titan::nn {
namespace {

using torch::autograd::variable_list;

// Inside the widened product the fp32 GEMM must stay fp32: CPU autocast would send at::mm back to bf16.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKey::AutocastCPU};
};

// The fp32 product of bf16 operands (or of fp32 ones already widened from bf16), rounded to bf16. Inputs
// may be strided views (a transposed weight): .to(kFloat) keeps their strides and the GEMM reads them
// transposed, as it would the bf16 ones.
at::Tensor widened_product(const at::Tensor& a, const at::Tensor& b) {
  const NoAutocast no_autocast;
  return at::mm(a.to(at::kFloat), b.to(at::kFloat)).to(at::kBFloat16);  // (M, N)
}

bool column_major(const at::Tensor& m) { return m.stride(0) == 1 && m.stride(1) == m.size(0); }

// mm's backward with the products widened: the gradients are those of a bf16 mm (fp32 sums of exact
// products, rounded to bf16), as autograd's mm backward forms them (dA = g B^T, dB = A^T g).
struct WidenedMmBackward : torch::autograd::Node {
  WidenedMmBackward(at::Tensor a, at::Tensor b) : a_(std::move(a)), b_(std::move(b)) {}

  variable_list apply(variable_list&& grads) override {
    const at::Tensor& g = grads[0];  // (M, N)
    at::Tensor da;                   // (M, K)
    at::Tensor db;                   // (K, N)
    if (!g.defined()) return {da, db};
    // The output is bf16, so its gradient holds bf16 values: widened once for both products.
    const at::Tensor g32 = g.to(at::kBFloat16).to(at::kFloat);  // (M, N)
    // A column-major operand (a Linear's w.t()) gets a column-major gradient, as ATen's mm backward gives
    // it: the weight's gradient is then contiguous, and AccumulateGrad takes it instead of copying it.
    if (task_should_compute_output(0)) {
      da = column_major(a_) ? widened_product(b_, g32.t()).t() : widened_product(g32, b_.t());
    }
    if (task_should_compute_output(1)) {
      db = column_major(b_) ? widened_product(g32.t(), a_).t() : widened_product(a_.t(), g32);
    }
    return {da, db};
  }
  std::string name() const override { return "titan::WidenedMmBackward"; }
  void release_variables() override {
    a_.reset();
    b_.reset();
  }

 private:
  at::Tensor a_;  // (M, K) bf16, detached
  at::Tensor b_;  // (K, N) bf16, detached
};

std::string setting() {
  const char* text = std::getenv("TITAN_BF16_GEMM");
  return text == nullptr ? "" : text;
}

// The timing the auto choice made, if it made one (for the start-up line).
std::optional<Bf16GemmTiming>& measured() {
  static std::optional<Bf16GemmTiming> timing;
  return timing;
}

std::atomic<Bf16Gemm>& choice() {
  static std::atomic<Bf16Gemm> value = choose_bf16_gemm(setting(), cpu_info(), [] {
    measured() = time_bf16_gemms();
    return *measured();
  });
  return value;
}

// The fastest of a few runs after a warm-up: interference (another rank computing on the same cores) only
// ever adds time, so the minimum is the estimate it disturbs least.
template <class Mm>
double fastest_seconds(const at::Tensor& a, const at::Tensor& b, Mm&& mm) {
  constexpr int kRuns = 5;
  (void)mm(a, b);  // warm-up: oneDNN creates its primitive, the pages of the output are touched
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kRuns; ++i) {
    const auto start = std::chrono::steady_clock::now();
    (void)mm(a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

Bf16GemmTiming time_bf16_gemms(int64_t n) {
  const at::NoGradGuard no_grad;
  const NoAutocast no_autocast;
  // A generator of its own: the choice is made at a moment no run controls, and must not move the
  // training's random stream (checkpointed, and equal across replicas).
  const at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/0);
  const at::Tensor a = at::randn({n, n}, gen).to(at::kBFloat16);  // (n, n)
  const at::Tensor b = at::randn({n, n}, gen).to(at::kBFloat16);  // (n, n)
  return {.n = n,
          .native_s = fastest_seconds(a, b, [](const at::Tensor& x, const at::Tensor& y) { return at::mm(x, y); }),
          .widened_s = fastest_seconds(a, b, widened_product)};
}

Bf16Gemm choose_bf16_gemm(const std::string& setting, const CpuInfo& cpu, const std::function<Bf16GemmTiming()>& time) {
  if (setting == "native") return Bf16Gemm::native;
  if (setting == "widened") return Bf16Gemm::widened;
  TITAN_CHECK_VALUE(setting.empty() || setting == "auto",
                    "[titan::nn::bf16_gemm] expected TITAN_BF16_GEMM to be auto, native or widened, got '{}'. "
                    "Unset it to let titan choose by the CPU.",
                    setting);
  if (cpu.amx_bf16) return Bf16Gemm::native;
  if (!cpu.avx512_bf16) return Bf16Gemm::widened;
  const Bf16GemmTiming t = time();
  return t.native_s <= t.widened_s ? Bf16Gemm::native : Bf16Gemm::widened;
}

Bf16Gemm bf16_gemm() { return choice().load(std::memory_order_relaxed); }

void set_bf16_gemm(Bf16Gemm value) { choice().store(value, std::memory_order_relaxed); }

Bf16Gemm agree_bf16_gemm(const dist::ProcessGroup& group, Bf16Gemm own) {
  if (group.size() == 1) return own;
  // Rank 0's choice, summed over the group: only rank 0 adds it.
  at::Tensor native = at::zeros({1}, at::kInt);  // (1)
  if (group.rank() == 0 && own == Bf16Gemm::native) native.fill_(1);
  group.all_reduce(native).wait();
  return native.item<int>() > 0 ? Bf16Gemm::native : Bf16Gemm::widened;
}

bool use_rank0_bf16_gemm(const dist::ProcessGroup& group) {
  const Bf16Gemm own = bf16_gemm();
  const Bf16Gemm agreed = agree_bf16_gemm(group, own);
  set_bf16_gemm(agreed);
  return agreed != own;
}

std::string describe_bf16_gemm() {
  const std::string text = setting();
  const Bf16Gemm chosen = bf16_gemm();  // makes the choice (and its timing) first
  std::string why;
  if (!text.empty() && text != "auto") {
    why = fmt::format("TITAN_BF16_GEMM={}", text);
  } else if (const auto& t = measured()) {
    why = fmt::format("AVX512-BF16 without AMX, timed at ({0}, {0}): ATen's bf16 kernel {1:.2f} ms, widened {2:.2f} ms",
                      t->n, 1e3 * t->native_s, 1e3 * t->widened_s);
  } else {
    why = cpu_info().amx_bf16 ? "the CPU has AMX-BF16" : "the CPU has no AVX512-BF16 or AMX-BF16";
  }
  return chosen == Bf16Gemm::native
             ? fmt::format("bf16 GEMMs on CPU: ATen's bf16 kernel ({}; TITAN_BF16_GEMM=widened to widen them)", why)
             : fmt::format(
                   "bf16 GEMMs on CPU: widened, fp32 GEMMs over the bf16 values, rounded to bf16 ({}; "
                   "TITAN_BF16_GEMM=native to use ATen's bf16 kernel)",
                   why);
}

bool bf16_gemms_at_bf16_rate(const at::Device& device) { return !device.is_cpu() || bf16_gemm() == Bf16Gemm::native; }

bool widens(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 && a.device().is_cpu() &&
         b.device().is_cpu() && bf16_gemm() == Bf16Gemm::widened;
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) { return widens(a, b) ? widened_mm(a, b) : at::mm(a, b); }

at::Tensor widened_mm(const at::Tensor& a, const at::Tensor& b) {
  TITAN_CHECK_VALUE(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && a.scalar_type() == at::kBFloat16 &&
                        b.scalar_type() == at::kBFloat16 && a.device().is_cpu() && b.device().is_cpu(),
                    "[titan::nn::widened_mm] expected bf16 CPU matrices (M, K) and (K, N), got {} and {}. Call "
                    "nn::mm, which falls back to at::mm for anything else.",
                    c10::str(a.scalar_type(), " ", a.sizes(), " on ", a.device()),
                    c10::str(b.scalar_type(), " ", b.sizes(), " on ", b.device()));
  at::Tensor out;  // (M, N) bf16
  {
    const at::NoGradGuard no_grad;
    out = widened_product(a.detach(), b.detach());
  }
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) {
    auto node =
        std::shared_ptr<WidenedMmBackward>(new WidenedMmBackward(a.detach(), b.detach()), torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(a, b));
    torch::autograd::set_history(out, node);
  }
  return out;
}

}  // namespace titan::nn
