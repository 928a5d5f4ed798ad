// SPDX-License-Identifier: BSD-3-Clause
// titan-plot: training curves of one or more runs from their metrics.jsonl (in job.dump_folder), one panel
// per metric and one colour per run, as PNG or SVG, without Python. See docs/observability.md#plots.
//   titan-plot outputs/run_a outputs/run_b -o curves.png --metrics loss,lr,grad_norm,tps,memory
// Metrics: loss, lr, grad_norm, tps, memory, mfu, tflops, val_loss, or any numeric key of metrics.jsonl.
#include <fmt/format.h>

#include <sstream>
#include <string>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/metrics/plot.hpp"

namespace {

constexpr const char* kUsage =
    "usage: titan-plot <run folder or metrics.jsonl>... [-o out.png|out.svg] [--metrics loss,lr,grad_norm,tps,memory]\n"
    "  metrics: loss, lr, grad_norm, tps, memory, mfu, tflops, val_loss, or any numeric key of metrics.jsonl\n";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> folders;
  std::string out = "metrics.png";
  titan::plot::PlotOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if ((arg == "-o" || arg == "--output") && i + 1 < argc) {
      out = argv[++i];
    } else if (arg == "--metrics" && i + 1 < argc) {
      options.metrics = split(argv[++i]);
    } else if (!arg.empty() && arg[0] == '-') {
      fmt::print(stderr, "titan-plot: unknown option '{}'\n{}", arg, kUsage);
      return 1;
    } else {
      folders.push_back(arg);
    }
  }
  if (folders.empty()) {
    fmt::print(stderr, "{}", kUsage);
    return 1;
  }
  try {
    std::vector<titan::plot::Run> runs;
    for (const auto& folder : folders) runs.push_back(titan::plot::read_run(folder));
    for (const auto& metric : options.metrics) {
      bool found = false;
      for (const auto& run : runs) found = found || run.series.count(titan::plot::metric_key(metric)) != 0;
      if (!found) fmt::print(stderr, "titan-plot: no run has '{}' (panel left empty)\n", metric);
    }
    titan::plot::write_plot(out, runs, options);
    fmt::print("wrote {} ({} run(s), {} panel(s))\n", out, runs.size(), options.metrics.size());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "titan-plot: {}\n", titan::error_message(e));
    return 1;
  }
}
