// SPDX-License-Identifier: BSD-3-Clause
// How a bf16 GEMM runs on CPU. ATen's bf16 GEMM (oneDNN) is fast with AMX and, on some CPUs, with
// AVX512-BF16 alone: on this project's AMD EPYC (Zen 4) it ran at 2.3-2.6x an fp32 GEMM of the same shape,
// on its Intel Xeon without AMX at 0.5-0.9x (benchmarks/mm_dtype.cpp); without either extension bf16 is
// converted in software, 40-140x slower than fp32. Where ATen's kernel is the slower one, titan runs a
// bf16 GEMM "widened": the bf16 operands are converted to fp32 and multiplied by the fp32 GEMM, and the
// product is rounded back to bf16. The numbers are those of a bf16 GEMM: a product of two bf16 values is
// exact in fp32, both kernels accumulate in fp32, and the output is rounded to bf16 (only the order of the
// fp32 sums differs). Autograd keeps the bf16 operands, not fp32 copies, so activation memory is that of bf16.
//
//   TITAN_BF16_GEMM=auto     (default) AMX-BF16: ATen's kernel; no AVX512-BF16: widened; AVX512-BF16 alone:
//                            the faster of the two, timed once per process on a (512, 512) product
//   TITAN_BF16_GEMM=native   ATen's bf16 GEMM
//   TITAN_BF16_GEMM=widened  always widened
//
// Only CPUs with AVX512-BF16 and no AMX are timed, and there the two forms are 2x or more apart; the fastest
// of several runs is compared, so a rank timed while another computes still sees the gap. A multi-rank run
// then takes rank 0's choice everywhere (agree_bf16_gemm, called by the trainer), so no rank runs the slow
// form and holds the others back. TITAN_BF16_GEMM pins it.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>

namespace titan {
struct CpuInfo;
}
namespace titan::dist {
class ProcessGroup;
}

namespace titan::nn {

/// How this process runs bf16 GEMMs on CPU.
enum class Bf16Gemm { native, widened };

/// TITAN_BF16_GEMM's choice for this process (read once; a bad value is an error naming it), or what
/// set_bf16_gemm set.
Bf16Gemm bf16_gemm();
/// Overrides the choice for the whole process (tests and benchmarks compare both; set it before a run).
void set_bf16_gemm(Bf16Gemm choice);
/// Rank 0's `own` choice, on every rank of `group` (collective; CPU groups).
Bf16Gemm agree_bf16_gemm(const dist::ProcessGroup& group, Bf16Gemm own);
/// Makes this process run rank 0's choice (agree_bf16_gemm over `group` of bf16_gemm(), then set_bf16_gemm);
/// true when this rank's own choice was overruled. Collective: the trainer and the benchmarks call it at start.
bool use_rank0_bf16_gemm(const dist::ProcessGroup& group);
/// Whether bf16 GEMMs on `device` run at its bf16 rate (CUDA, or ATen's CPU kernel), not the fp32 rate of a
/// widened one: which peak MFU is measured against.
bool bf16_gemms_at_bf16_rate(const at::Device& device);
/// One line for the trainer's start-up log: the choice and why.
std::string describe_bf16_gemm();
/// Seconds of one bf16 (n, n) x (n, n) product each way: what the auto choice compares.
struct Bf16GemmTiming {
  int64_t n = 512;       ///< the product's size
  double native_s = 0;   ///< ATen's bf16 GEMM, the fastest of a few after a warm-up
  double widened_s = 0;  ///< widened_mm, the same way
};
/// Times both forms on this CPU with the current intra-op threads (about 20 ms).
Bf16GemmTiming time_bf16_gemms(int64_t n = 512);
/// The rule behind bf16_gemm() for a TITAN_BF16_GEMM value ("" = unset) and a CPU; `time` is called only
/// for a CPU with AVX512-BF16 and no AMX-BF16 (tests pass their own).
Bf16Gemm choose_bf16_gemm(const std::string& setting, const CpuInfo& cpu, const std::function<Bf16GemmTiming()>& time);

/// a (M, K) x b (K, N) -> (M, N). Both bf16 on CPU with widened GEMMs: the widened product (differentiable
/// in both); otherwise at::mm. Callers cast for autocast first.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b);
/// Whether mm(a, b) takes the widened path.
bool widens(const at::Tensor& a, const at::Tensor& b);
/// The widened product of bf16 a (M, K) and b (K, N) on CPU, whatever the choice: fp32 GEMM, rounded to
/// bf16; autograd keeps a and b in bf16 and widens the backward's two GEMMs the same way.
at::Tensor widened_mm(const at::Tensor& a, const at::Tensor& b);

}  // namespace titan::nn
