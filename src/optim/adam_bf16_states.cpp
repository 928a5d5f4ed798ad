// SPDX-License-Identifier: BSD-3-Clause
// Adam / AdamW with bf16 moments: checks, the ATen twin, and the choice between the fused CPU kernel
// (by CPU capability) and the twin.
#include "titan/optim/detail/adam_bf16_states.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "adam_bf16_states_kernel.hpp"
#include "titan/core/detail/cpu_dispatch.hpp"
#include "titan/core/error.hpp"

namespace titan::detail {
namespace {

void check(const AdamBf16Tensors& t) {
  TITAN_CHECK_VALUE(t.param.defined() && t.grad.defined() && t.exp_avg.defined() && t.exp_avg_sq.defined(),
                    "[titan::adam_step_bf16_states] expected a parameter, its gradient, exp_avg and exp_avg_sq, "
                    "got an undefined tensor among them.");
  TITAN_CHECK_VALUE(t.param.scalar_type() == at::kFloat && t.grad.scalar_type() == at::kFloat,
                    "[titan::adam_step_bf16_states] expected a float32 parameter and gradient, got {} and {}. "
                    "bf16 moments need fp32 master weights (training.dtype = \"float32\").",
                    c10::toString(t.param.scalar_type()), c10::toString(t.grad.scalar_type()));
  TITAN_CHECK_VALUE(t.exp_avg.scalar_type() == at::kBFloat16 && t.exp_avg_sq.scalar_type() == at::kBFloat16,
                    "[titan::adam_step_bf16_states] expected bfloat16 exp_avg and exp_avg_sq, got {} and {}.",
                    c10::toString(t.exp_avg.scalar_type()), c10::toString(t.exp_avg_sq.scalar_type()));
  TITAN_CHECK_VALUE(t.grad.sizes() == t.param.sizes() && t.exp_avg.sizes() == t.param.sizes() &&
                        t.exp_avg_sq.sizes() == t.param.sizes(),
                    "[titan::adam_step_bf16_states] expected gradient and moments shaped like the parameter {}, "
                    "got {}, {} and {}.",
                    c10::str(t.param.sizes()), c10::str(t.grad.sizes()), c10::str(t.exp_avg.sizes()),
                    c10::str(t.exp_avg_sq.sizes()));
}

using Kernel = void (*)(const AdamBf16Args&);

/// The widest kernel this CPU runs (ATen's runtime dispatch idea, without its registry).
Kernel widest_kernel() {
  static const Kernel chosen = detail::cpu_runs_avx2() ? adam_bf16_step_avx2 : adam_bf16_step_default;
  return chosen;
}

bool fused_kernel_runs(const AdamBf16Tensors& t) {
  const auto on_cpu = [](const at::Tensor& x) { return x.device().is_cpu(); };
  return on_cpu(t.param) && on_cpu(t.grad) && on_cpu(t.exp_avg) && on_cpu(t.exp_avg_sq) && t.param.is_contiguous() &&
         t.exp_avg.is_contiguous() && t.exp_avg_sq.is_contiguous();
}

void run_cpu(const AdamBf16Tensors& t, const AdamStepScalars& s, Kernel kernel) {
  if (t.param.numel() == 0) return;
  const at::Tensor grad = t.grad.contiguous();  // no copy unless autograd left it strided
  // The scalars as the reference's ATen ops see them: worked out in double, used as float.
  const double bias_correction1 = 1.0 - std::pow(s.beta1, s.step);
  const double bias_correction2 = 1.0 - std::pow(s.beta2, s.step);
  const float lerp_weight = static_cast<float>(1.0 - s.beta1);
  kernel({.param = t.param.mutable_data_ptr<float>(),
          .grad = grad.const_data_ptr<float>(),
          .exp_avg = t.exp_avg.mutable_data_ptr<c10::BFloat16>(),
          .exp_avg_sq = t.exp_avg_sq.mutable_data_ptr<c10::BFloat16>(),
          .n = t.param.numel(),
          .decoupled = s.decoupled,
          .l2 = !s.decoupled && s.weight_decay != 0,
          .decay = static_cast<float>(1.0 - s.lr * s.weight_decay),
          .weight_decay = static_cast<float>(s.weight_decay),
          .lerp_small = std::abs(lerp_weight) < 0.5f,
          .lerp_coefficient = std::abs(lerp_weight) < 0.5f ? lerp_weight : lerp_weight - 1.0f,
          .beta2 = static_cast<float>(s.beta2),
          .sq_weight = static_cast<float>(1.0 - s.beta2),
          .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
          .eps = static_cast<float>(s.eps),
          .step_size = static_cast<float>(-s.lr / bias_correction1)});
}

}  // namespace

void adam_step_bf16_states(const AdamBf16Tensors& t, const AdamStepScalars& s) {
  check(t);
  if (fused_kernel_runs(t)) {
    run_cpu(t, s, widest_kernel());
  } else {
    adam_step_bf16_states_reference(t, s);
  }
}

void adam_step_bf16_states_reference(const AdamBf16Tensors& t, const AdamStepScalars& s) {
  check(t);
  at::NoGradGuard no_grad;
  const at::Tensor& p = t.param;
  at::Tensor g = t.grad;
  const at::Tensor m = t.exp_avg.to(at::kFloat);
  const at::Tensor v = t.exp_avg_sq.to(at::kFloat);
  if (s.decoupled) {
    p.mul_(1.0 - s.lr * s.weight_decay);
  } else if (s.weight_decay != 0) {
    g = g.add(p, s.weight_decay);
  }
  m.lerp_(g, 1.0 - s.beta1);
  v.mul_(s.beta2).addcmul_(g, g, 1.0 - s.beta2);
  const double bias_correction1 = 1.0 - std::pow(s.beta1, s.step);
  const double bias_correction2 = 1.0 - std::pow(s.beta2, s.step);
  const at::Tensor denom = (v.sqrt() / std::sqrt(bias_correction2)).add_(s.eps);
  p.addcdiv_(m, denom, -s.lr / bias_correction1);
  t.exp_avg.copy_(m);  // rounds to nearest even
  t.exp_avg_sq.copy_(v);
}

std::vector<std::string> adam_bf16_states_cpu_builds() { return cpu_runnable_builds(); }

void adam_step_bf16_states_cpu(const AdamBf16Tensors& t, const AdamStepScalars& s, std::string_view build) {
  check(t);
  TITAN_CHECK_VALUE(fused_kernel_runs(t),
                    "[titan::adam_step_bf16_states_cpu] expected contiguous CPU tensors, got the parameter on {} "
                    "(contiguous: {}). Use adam_step_bf16_states, which falls back to the ATen twin.",
                    t.param.device().str(), t.param.is_contiguous());
  TITAN_CHECK_VALUE(build == "default" || (build == "avx2" && detail::cpu_runs_avx2()),
                    "[titan::adam_step_bf16_states_cpu] expected a build this CPU runs (default{}), got '{}'.",
                    detail::cpu_runs_avx2() ? ", avx2" : "", build);
  run_cpu(t, s, build == "avx2" ? adam_bf16_step_avx2 : adam_bf16_step_default);
}

}  // namespace titan::detail
