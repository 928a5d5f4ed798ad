// SPDX-License-Identifier: BSD-3-Clause
#include "titan/core/cpu_info.hpp"

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <string>

namespace titan {

namespace {

double cpu_clock_hz(std::string_view proc_cpuinfo) {
  // Prefer the rated maximum (boost) clock; under a hypervisor only "cpu MHz" (nominal) exists.
  std::ifstream max_freq("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  double khz = 0;
  if (max_freq >> khz && khz > 0) return khz * 1e3;
  std::istringstream in{std::string(proc_cpuinfo)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) return std::stod(line.substr(line.find(':') + 1)) * 1e6;
  }
  return 2.0e9;
}

std::string read_proc_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

CpuInfo parse_cpu_info(std::string_view proc_cpuinfo, double clock_hz) {
  CpuInfo info;
  info.clock_hz = clock_hz;
  std::istringstream in{std::string(proc_cpuinfo)};
  std::string line;
  std::string flags;
  while (std::getline(in, line) && (info.model.empty() || flags.empty())) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    if (line.rfind("model name", 0) == 0 && info.model.empty()) info.model = value;
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = " " + value + " ";
  }
  const auto has = [&](const char* flag) { return flags.find(fmt::format(" {} ", flag)) != std::string::npos; };
  info.fma = has("fma");
  info.avx2 = has("avx2");
  info.avx512 = has("avx512f");
  info.avx512_bf16 = has("avx512_bf16");
  info.amx_bf16 = has("amx_bf16") && has("amx_tile");
  if (info.model.empty()) info.model = "unknown CPU";
  return info;
}

double CpuInfo::flops_per_cycle(bool bf16) const {
  const double fp32 = avx512 ? 64 : (fma ? 32 : 8);
  if (!bf16) return fp32;
  if (amx_bf16) return 1024;  // one TMUL: 16 x 32 bf16 products + sums per cycle
  if (avx512_bf16) return 2 * fp32;
  return fp32;
}

std::string CpuInfo::describe() const {
  const auto yes_no = [](bool on, const char* name) { return fmt::format("{}{}", on ? "" : "no ", name); };
  return fmt::format("{}: {}, {}, {}, {}, {:.2f} GHz", model, yes_no(avx2, "AVX2"), yes_no(avx512, "AVX-512"),
                     yes_no(avx512_bf16, "AVX512-BF16"), yes_no(amx_bf16, "AMX-BF16"), clock_hz / 1e9);
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = [] {
    const std::string text = read_proc_cpuinfo();
    return parse_cpu_info(text, cpu_clock_hz(text));
  }();
  return info;
}

}  // namespace titan
