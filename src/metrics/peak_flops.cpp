// SPDX-License-Identifier: BSD-3-Clause
#include <fmt/format.h>

#include <array>
#include <string>
#include <utility>

#include "titan/core/cpu_info.hpp"
#include "titan/metrics/detail/device_memory.hpp"
#include "titan/metrics/metrics.hpp"

#include <c10/util/Exception.h>

namespace titan {

std::optional<double> gpu_peak_flops(const std::string& name) {
  // torchtitan's bf16 dense table (tools/utils.py get_peak_flops), most specific names first.
  static const std::array<std::pair<const char*, double>, 14> kTable = {{
      {"GB300", 2.5e15},
      {"GB200", 2.5e15},
      {"B300", 2.25e15},
      {"B200", 2.25e15},
      {"H100 NVL", 835e12},
      {"H100 PCIe", 756e12},
      {"H100", 989e12},
      {"H200", 989e12},
      {"H20", 148e12},
      {"A100", 312e12},
      {"A6000", 154.85e12},
      {"L40S", 362e12},
      {"MI355X", 2500e12},
      {"MI300X", 1300e12},
  }};
  for (const auto& [key, flops] : kTable) {
    if (name.find(key) != std::string::npos) return flops;
  }
  return std::nullopt;
}

std::optional<int64_t> gpu_memory_bytes(const std::string& name) {
  // The vendors' figures (decimal GB), most specific names first, as in the peak table.
  static const std::array<std::pair<const char*, int64_t>, 14> kTable = {{
      {"GB300", 288'000'000'000},
      {"GB200", 186'000'000'000},
      {"B300", 288'000'000'000},
      {"B200", 180'000'000'000},
      {"H100 NVL", 94'000'000'000},
      {"H100 PCIe", 80'000'000'000},
      {"H100", 80'000'000'000},
      {"H200", 141'000'000'000},
      {"H20", 96'000'000'000},
      {"A100", 80'000'000'000},
      {"A6000", 48'000'000'000},
      {"L40S", 48'000'000'000},
      {"MI355X", 288'000'000'000},
      {"MI300X", 192'000'000'000},
  }};
  for (const auto& [key, bytes] : kTable) {
    if (name.find(key) != std::string::npos) return bytes;
  }
  return std::nullopt;
}

int64_t parse_memory_size(std::string_view text, std::string_view what) {
  const std::string s(text);
  size_t end = 0;
  double value = -1;
  try {
    value = std::stod(s, &end);
  } catch (const std::exception&) {
    value = -1;
  }
  std::string unit = s.substr(std::min(end, s.size()));
  unit.erase(0, unit.find_first_not_of(' '));
  static const std::array<std::pair<const char*, double>, 9> kUnits = {{{"", 1.0},
                                                                        {"B", 1.0},
                                                                        {"KB", 1e3},
                                                                        {"MB", 1e6},
                                                                        {"GB", 1e9},
                                                                        {"TB", 1e12},
                                                                        {"KiB", 1024.0},
                                                                        {"MiB", 1024.0 * 1024},
                                                                        {"GiB", 1024.0 * 1024 * 1024}}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name && value > 0) return static_cast<int64_t>(value * scale);
  }
  TORCH_CHECK_VALUE(false, fmt::format("[titan::parse_memory_size] expected {} as a positive number with a unit "
                                       "(80GB, 141 GB, 80GiB, 512MiB) or a GPU name, got '{}'.",
                                       what, text));
  return 0;
}

PeakFlops peak_flops(const at::Device& device, int64_t num_threads, double declared, bool bf16_gemms) {
  if (declared > 0) return {declared, fmt::format("{:.3g} FLOP/s (declared by metrics.peak_flops)", declared)};
  if (device.is_cuda()) {
    const auto name = detail::cuda_device_name(device.index() < 0 ? 0 : device.index()).value_or("unknown GPU");
    if (auto flops = gpu_peak_flops(name)) return {*flops, fmt::format("{:.3g} FLOP/s bf16 dense ({})", *flops, name)};
    return {312e12, fmt::format("312e12 FLOP/s: '{}' is not in the peak table, assuming A100; set "
                                "metrics.peak_flops",
                                name)};
  }
  const CpuInfo& cpu = cpu_info();
  const bool bf16 = bf16_gemms && cpu.native_bf16();
  const double flops = cpu.peak_flops(num_threads, bf16_gemms);
  return {flops,
          fmt::format("{:.3g} FLOP/s {} = {} threads x {} FLOP/cycle x {:.2f} GHz{} (set "
                      "metrics.peak_flops to declare another)",
                      flops, bf16 ? "bf16" : "fp32", num_threads, cpu.flops_per_cycle(bf16_gemms), cpu.clock_hz / 1e9,
                      bf16_gemms && !bf16 ? ", bf16 GEMMs run at the fp32 rate on this CPU" : "")};
}

}  // namespace titan
