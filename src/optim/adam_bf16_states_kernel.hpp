// SPDX-License-Identifier: BSD-3-Clause
// The fused bf16-moment Adam / AdamW kernel on raw pointers, compiled once per CPU capability
// (adam_bf16_states_kernel.inc in adam_bf16_states_cpu_default.cpp and, with -mavx2 -mfma,
// adam_bf16_states_cpu_avx2.cpp); adam_bf16_states.cpp picks the widest one the CPU runs. Tensors and
// checks stay there.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace titan::detail {

/// One step over n contiguous elements. The scalars are the fp32 values the reference's ATen ops
/// compute with (each worked out in double, then rounded to float, as a Scalar operand is).
struct AdamBf16Args {
  float* param = nullptr;               ///< (n) fp32, in place
  const float* grad = nullptr;          ///< (n) fp32
  c10::BFloat16* exp_avg = nullptr;     ///< (n) bf16, in place
  c10::BFloat16* exp_avg_sq = nullptr;  ///< (n) bf16, in place
  int64_t n = 0;                        ///< elements
  bool decoupled = true;                ///< AdamW: p *= decay
  bool l2 = false;                      ///< Adam with weight decay: g += weight_decay * p
  float decay = 1;                      ///< 1 - lr * weight_decay
  float weight_decay = 0;               ///< Adam's L2 coefficient
  /// m = lerp(m, g, w) with w = 1 - beta1, as ATen's lerp: fma(w, g - m, m) when |w| < 0.5 (lerp_small),
  /// else fma(w - 1, g - m, g). lerp_coefficient is w or w - 1.
  bool lerp_small = true;
  float lerp_coefficient = 0.1f;
  float beta2 = 0.95f;              ///< v *= beta2
  float sq_weight = 0.05f;          ///< 1 - beta2: v += sq_weight * g * g
  float bias_correction2_sqrt = 1;  ///< sqrt(1 - beta2^step)
  float eps = 1e-8f;                ///< denom = sqrt(v) / bias_correction2_sqrt + eps
  float step_size = 0;              ///< -lr / (1 - beta1^step): p += step_size * m / denom
};

void adam_bf16_step_default(const AdamBf16Args& args);
void adam_bf16_step_avx2(const AdamBf16Args& args);

}  // namespace titan::detail
