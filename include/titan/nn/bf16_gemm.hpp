// SPDX-License-Identifier: BSD-3-Clause
// How a bf16 GEMM runs on CPU. ATen's bf16 GEMM is fast only with AMX; with AVX512-BF16 alone it measured
// 0.5-0.9x of an fp32 GEMM of the same shape (benchmarks/mm_dtype.cpp), and without it bf16 is converted in
// software. There titan runs a bf16 GEMM "widened": the bf16 operands are converted to fp32 and multiplied
// by the fp32 GEMM, and the product is rounded back to bf16. The numbers are those of a bf16 GEMM: a product
// of two bf16 values is exact in fp32, both kernels accumulate in fp32, and the output is rounded to bf16
// (only the order of the fp32 sums differs). Autograd keeps the bf16 operands, not fp32 copies, so
// activation memory is that of bf16.
//
//   TITAN_BF16_GEMM=auto     (default) widened unless the CPU has AMX-BF16
//   TITAN_BF16_GEMM=native   ATen's bf16 GEMM
//   TITAN_BF16_GEMM=widened  always widened
//
// The choice depends only on the CPU's flags and the environment, so every rank of a run makes the same one.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace titan::nn {

/// How this process runs bf16 GEMMs on CPU.
enum class Bf16Gemm { native, widened };

/// TITAN_BF16_GEMM's choice for this process (read once; a bad value is an error naming it), or what
/// set_bf16_gemm set.
Bf16Gemm bf16_gemm();
/// Overrides the choice for the whole process (tests and benchmarks compare both; set it before a run).
void set_bf16_gemm(Bf16Gemm choice);
/// Whether bf16 GEMMs on `device` run at its bf16 rate (CUDA, or ATen's CPU kernel), not the fp32 rate of a
/// widened one: which peak MFU is measured against.
bool bf16_gemms_at_bf16_rate(const at::Device& device);
/// One line for the trainer's start-up log: the choice and why.
std::string describe_bf16_gemm();
/// The rule behind bf16_gemm() for a TITAN_BF16_GEMM value ("" = unset) and a CPU (for tests).
Bf16Gemm choose_bf16_gemm(const std::string& setting, bool cpu_has_amx_bf16);

/// a (M, K) x b (K, N) -> (M, N). Both bf16 on CPU with widened GEMMs: the widened product (differentiable
/// in both); otherwise at::mm. Callers cast for autocast first.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);
/// Whether mm(a, b) takes the widened path.
bool widens(const at::Tensor& a, const at::Tensor& b);
/// The widened product of bf16 a (M, K) and b (K, N) on CPU, whatever the choice: fp32 GEMM, rounded to
/// bf16; autograd keeps a and b in bf16 and widens the backward's two GEMMs the same way.
at::Tensor widened_mm(const at::Tensor& a, const at::Tensor& b);

}  // namespace titan::nn
