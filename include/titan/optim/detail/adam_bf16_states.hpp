// SPDX-License-Identifier: BSD-3-Clause
// One parameter's Adam / AdamW step with bf16 moments (optimizer.implementation fused_opt_states_bf16):
// fp32 parameter and gradient, bf16 exp_avg and exp_avg_sq. The math is the for-loop reference's
// (optim/adamw.cpp), op for op in fp32 on the moments widened from bf16; the update reads the fp32
// moments, which are then rounded to bf16 (nearest even, as at::Tensor::to) on store. Contiguous CPU
// tensors take a fused at::vec kernel, compiled once per CPU capability (as float8's casts are); any
// other tensor takes the ATen twin, which the tests hold the kernel to.
//
//   titan::detail::adam_step_bf16_states({.param = p, .grad = p.grad(), .exp_avg = m, .exp_avg_sq = v},
//                                        {.lr = 1e-3, .weight_decay = 0.1, .step = 1});
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

namespace titan::detail {

/// One step's hyperparameters, as the for-loop reference reads them.
struct AdamStepScalars {
  bool decoupled = true;  ///< AdamW: p *= 1 - lr * weight_decay; Adam: g += weight_decay * p
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;
  double step = 1;  ///< this step's count (1 on the first step), for the bias corrections
};

/// One parameter and its moments, all of one shape.
struct AdamBf16Tensors {
  at::Tensor param;       ///< float32, updated in place
  at::Tensor grad;        ///< float32
  at::Tensor exp_avg;     ///< bfloat16, updated in place
  at::Tensor exp_avg_sq;  ///< bfloat16, updated in place
};

/// One step: the fused kernel of the widest build this CPU runs when param, exp_avg and exp_avg_sq are
/// contiguous CPU tensors (a strided gradient is made contiguous first), the ATen twin otherwise (CUDA).
void adam_step_bf16_states(const AdamBf16Tensors& t, const AdamStepScalars& s);

/// The plain ATen twin: the for-loop reference's per-tensor ops on float32 copies of the moments, which
/// are then copied back (rounded) into the bfloat16 ones.
void adam_step_bf16_states_reference(const AdamBf16Tensors& t, const AdamStepScalars& s);

/// The CPU kernel builds this CPU runs, widest first: {"avx2", "default"} on AVX2 + FMA CPUs, else
/// {"default"}.
std::vector<std::string> adam_bf16_states_cpu_builds();

/// adam_step_bf16_states with the named CPU build, on contiguous CPU tensors (tests and benchmarks).
void adam_step_bf16_states_cpu(const AdamBf16Tensors& t, const AdamStepScalars& s, std::string_view build);

}  // namespace titan::detail
