// SPDX-License-Identifier: BSD-3-Clause
// titan-pp-schedule: builds (or reads) the pipeline schedule of a job, validates it and prints its simulated
// timeline and bubble, optionally as an SVG picture. The job's keys say which: its schedule, its degree and its
// microbatches (training.local_batch_size / parallelism.pipeline_parallel_microbatch_size), as the trainer runs it.
//   titan-pp-schedule --parallelism.pipeline_parallel_schedule ZBVZeroBubble --parallelism.pipeline_parallel_degree 4
//                     --training.local_batch_size 8 [--stages N] [--svg OUT.svg] [--costs F,B,I,W]
//   titan-pp-schedule --job.config_file run.toml
// With parallelism.pipeline_parallel_schedule_csv, the schedule is read from torchtitan's CSV format
// (pipeline_parallel_schedule then only names the schedule whose published bubble is printed beside it).
// See docs/pipeline_schedules.md.
#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <string>

#include "titan/core/choices.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace pp = titan::parallel;

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-pp-schedule",
    .usage =
        "usage: titan-pp-schedule [--parallelism.pipeline_parallel_schedule NAME] "
        "[--parallelism.pipeline_parallel_degree N]\n"
        "                         [--training.local_batch_size M] [--parallelism.pipeline_parallel_schedule_csv "
        "FILE]\n"
        "                         [--stages N] [--svg OUT.svg] [--costs F,B,I,W] [--job.config_file FILE ...]\n",
    .flags = {{.name = "--stages",
               .value = "N",
               .help = "stages in all (default: the degree, twice it for a multi-stage schedule)"},
              {.name = "--svg", .value = "OUT.svg", .help = "also draw the timeline as SVG"},
              {.name = "--costs",
               .value = "F,B,I,W",
               .help = "durations of a forward, a backward, its input and its weight half (default 1,2,1,1)"}},
    .renamed = {{.flag = "--schedule", .instead = "--parallelism.pipeline_parallel_schedule NAME"},
                {.flag = "--pp", .instead = "--parallelism.pipeline_parallel_degree N"},
                {.flag = "--csv", .instead = "--parallelism.pipeline_parallel_schedule_csv FILE"},
                {.flag = "--microbatches",
                 .instead = "--training.local_batch_size M (microbatches = training.local_batch_size / "
                            "parallelism.pipeline_parallel_microbatch_size, 1 by default)"}},
    .keys =
        "parallelism.pipeline_parallel_schedule, pipeline_parallel_degree, pipeline_parallel_schedule_csv, "
        "pipeline_parallel_microbatch_size, training.local_batch_size"};

pp::PipelineCosts costs_of(const std::string& text) {
  std::vector<double> values;
  std::istringstream in(text);
  try {
    for (std::string cell; std::getline(in, cell, ',');) values.push_back(std::stod(cell));
  } catch (const std::exception&) {
    values.clear();
  }
  TITAN_CHECK_VALUE(values.size() == 4, "[titan-pp-schedule] expected --costs F,B,I,W (4 numbers), got '{}'.", text);
  return {.forward = values[0], .backward = values[1], .backward_input = values[2], .backward_weight = values[3]};
}

// The pipeline microbatches of one step, as the trainer splits the local batch.
int64_t microbatches_of(const titan::JobConfig& config) {
  const int64_t batch = config.training.local_batch_size;
  const int64_t size = config.parallelism.pipeline_parallel_microbatch_size;
  TITAN_CHECK_VALUE(size >= 1 && batch % size == 0,
                    "[titan-pp-schedule] expected training.local_batch_size ({}) to be a multiple of "
                    "parallelism.pipeline_parallel_microbatch_size ({}).",
                    batch, size);
  return batch / size;
}

}  // namespace

int main(int argc, char** argv) {
  return titan::run_tool(kSpec, argc, argv, [&](const titan::ToolArgs& args) {
    const titan::ParallelismConfig& p = args.config.parallelism;
    const int64_t ranks = p.pipeline_parallel_degree;
    TITAN_CHECK_VALUE(ranks >= 2, "[titan-pp-schedule] expected parallelism.pipeline_parallel_degree >= 2, got {}.",
                      ranks);
    const int64_t microbatches = microbatches_of(args.config);
    const pp::PipelineCosts costs = costs_of(args.value("--costs").value_or("1,2,1,1"));
    const titan::PipelineSchedule schedule = p.pipeline_parallel_schedule;
    pp::PipelineProgram program;
    if (!p.pipeline_parallel_schedule_csv.empty()) {
      program = pp::read_pipeline_csv(p.pipeline_parallel_schedule_csv, ranks, microbatches);
    } else {
      const int64_t stages = args.integer("--stages", ranks * (pp::is_single_stage(schedule) ? 1 : 2));
      program = pp::make_pipeline_program(schedule, ranks, stages, microbatches);
    }
    pp::validate_pipeline_program(program);
    const pp::PipelineTimeline timeline = pp::simulate_pipeline(program, costs);
    fmt::print("{}: pp {}, {} stages, {} microbatches, costs F={} B={} I={} W={}: valid\n", program.name, ranks,
               program.num_stages, microbatches, costs.forward, costs.backward, costs.backward_input,
               costs.backward_weight);
    fmt::print("{}", pp::render_timeline_text(timeline));
    const double theory = pp::theoretical_bubble(schedule, ranks, microbatches, program.num_stages / ranks, costs);
    fmt::print("bubble: simulated {:.1f}%, theoretical {:.1f}%{}\n", 100 * pp::bubble_fraction(timeline), 100 * theory,
               p.pipeline_parallel_schedule_csv.empty() ? "" : fmt::format(" ({}'s)", schedule));
    if (const auto svg = args.value("--svg")) {
      std::ofstream out(*svg);
      out << pp::render_timeline_svg(timeline,
                                     fmt::format("{} pp={} microbatches={}", program.name, ranks, microbatches));
      if (!out) throw std::runtime_error(fmt::format("[titan-pp-schedule] could not write {}", *svg));
      fmt::print("wrote {}\n", *svg);
    }
    return 0;
  });
}
