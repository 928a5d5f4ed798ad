// SPDX-License-Identifier: BSD-3-Clause
// titan-plot: training curves of one or more runs from their metrics.jsonl (in job.dump_folder), one panel
// per metric and one colour per run, as PNG or SVG, without Python. See docs/observability.md#plots.
//   titan-plot outputs/run_a outputs/run_b -o curves.png --metrics loss,lr,grad_norm,tps,memory
//   titan-plot --job.config_file run.toml -o curves.svg      (the job's run: its job.dump_folder)
// Metrics: loss, lr, grad_norm, tps, memory, mfu, tflops, val_loss, or any numeric key of metrics.jsonl.
#include <fmt/format.h>

#include <sstream>
#include <string>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/metrics/plot.hpp"

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-plot",
    .usage =
        "usage: titan-plot [RUN...] [-o out.png|out.svg] [--metrics loss,lr,grad_norm,tps,memory]\n"
        "  RUN: a run folder (job.dump_folder) or its metrics.jsonl; default: the job's job.dump_folder\n"
        "  metrics: loss, lr, grad_norm, tps, memory, mfu, tflops, val_loss, or any numeric key of metrics.jsonl\n",
    .flags = {{.name = "--output",
               .value = "FILE",
               .help = "the picture: .png or .svg (default metrics.png)",
               .alias = "-o"},
              {.name = "--metrics", .value = "A,B", .help = "one panel each (default loss,lr,grad_norm,tps,memory)"}},
    .keys = "job.dump_folder (the run when none is named)",
    .words = "run folders"};

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
  return titan::run_tool(kSpec, argc, argv, [&](const titan::ToolArgs& args) {
    const std::vector<std::string> folders =
        args.words.empty() ? std::vector<std::string>{args.config.job.dump_folder} : args.words;
    const std::string out = args.value("--output").value_or("metrics.png");
    titan::plot::PlotOptions options;
    if (const auto metrics = args.value("--metrics")) options.metrics = split(*metrics);
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
  });
}
