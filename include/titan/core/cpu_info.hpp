// SPDX-License-Identifier: BSD-3-Clause
// What this CPU offers a GEMM: the vector and matrix extensions (AVX2, AVX-512, AVX512-BF16, AMX-BF16) read
// from the kernel's flag list, and the peak dense FLOP/s that follows in fp32 and in bf16. The trainer logs
// it at start and reports MFU against the peak of the dtype its GEMMs run in (metrics/metrics.hpp).
//
//   const titan::CpuInfo cpu = titan::cpu_info();
//   cpu.describe();                        // "Intel(R) Xeon(R) ...: AVX2, AVX-512, AVX512-BF16, no AMX"
//   cpu.peak_flops(2, /*bf16=*/true);      // 2 cores x 128 FLOP/cycle x clock
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace titan {

struct CpuInfo {
  std::string model{};       ///< /proc/cpuinfo's "model name"
  bool fma = false;          ///< 256-bit fused multiply-add (with AVX2)
  bool avx2 = false;         ///< 256-bit integer and float vectors
  bool avx512 = false;       ///< AVX-512 foundation (512-bit FMA)
  bool avx512_bf16 = false;  ///< VDPBF16PS: bf16 dot products at twice the fp32 FMA rate
  bool amx_bf16 = false;     ///< AMX tiles with bf16 TMUL (Sapphire Rapids and later)
  double clock_hz = 0;       ///< rated maximum clock, or the nominal one under a hypervisor

  /// Whether bf16 GEMMs run natively (AVX512-BF16 or AMX); elsewhere ATen widens bf16 to fp32.
  bool native_bf16() const { return avx512_bf16 || amx_bf16; }
  /// Dense FLOP per cycle per core: fp32 FMA (2 pipes x 8 or 16 lanes x 2), bf16 by VDPBF16PS (twice
  /// fp32's) or AMX (1024), and fp32's without a native bf16 path.
  double flops_per_cycle(bool bf16) const;
  /// threads x flops_per_cycle x clock.
  double peak_flops(int64_t threads, bool bf16) const { return double(threads) * flops_per_cycle(bf16) * clock_hz; }
  /// "<model>: AVX2, AVX-512, AVX512-BF16, no AMX-BF16, 2.90 GHz".
  std::string describe() const;
};

/// This machine's CPU (read once from /proc/cpuinfo and sysfs).
const CpuInfo& cpu_info();

/// The CpuInfo of one /proc/cpuinfo text and a clock (for tests of the parsing).
CpuInfo parse_cpu_info(std::string_view proc_cpuinfo, double clock_hz);

}  // namespace titan
