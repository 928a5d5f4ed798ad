// SPDX-License-Identifier: BSD-3-Clause
// titan-pp-schedule: builds (or reads) a pipeline schedule, validates it and prints its simulated
// timeline and bubble, optionally as an SVG picture.
//   titan-pp-schedule --schedule ZBVZeroBubble --pp 4 --microbatches 8 [--stages N] [--csv FILE]
//                     [--svg OUT.svg] [--costs F,B,I,W]
// With --csv, the schedule is read from torchtitan's CSV format (--schedule then only names the
// schedule whose published bubble is printed beside it). See docs/pipeline_schedules.md.
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "titan/core/choices.hpp"
#include "titan/core/error.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

namespace pp = titan::parallel;

namespace {

constexpr const char* kUsage =
    "usage: titan-pp-schedule --schedule NAME --pp N --microbatches M [--stages N] [--csv FILE] [--svg OUT.svg]\n"
    "                         [--costs F,B,I,W]\n";

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"pp", "2"}, {"microbatches", "4"}, {"costs", "1,2,1,1"}};
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    const bool known = key == "--schedule" || key == "--pp" || key == "--microbatches" || key == "--stages" ||
                       key == "--csv" || key == "--svg" || key == "--costs";
    if (!known || i + 1 >= argc)
      throw std::invalid_argument(fmt::format("unknown or incomplete flag {}\n{}", key, kUsage));
    flags[key.substr(2)] = argv[i + 1];
  }
  if (!flags.contains("schedule") && !flags.contains("csv")) throw std::invalid_argument(kUsage);
  return flags;
}

pp::PipelineCosts costs_of(const std::string& text) {
  std::vector<double> values;
  std::istringstream in(text);
  for (std::string cell; std::getline(in, cell, ',');) values.push_back(std::stod(cell));
  if (values.size() != 4) {
    throw std::invalid_argument(
        fmt::format("[titan-pp-schedule] expected --costs F,B,I,W (4 numbers), got '{}'.", text));
  }
  return {.forward = values[0], .backward = values[1], .backward_input = values[2], .backward_weight = values[3]};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto flags = parse(argc, argv);
    const int64_t ranks = std::stoll(flags.at("pp"));
    const int64_t microbatches = std::stoll(flags.at("microbatches"));
    const pp::PipelineCosts costs = costs_of(flags.at("costs"));
    std::optional<titan::PipelineSchedule> schedule;
    if (flags.contains("schedule")) {
      schedule = titan::parse_choice<titan::PipelineSchedule>(flags.at("schedule"));
      if (!schedule) {
        throw std::invalid_argument(fmt::format("[titan-pp-schedule] expected --schedule {}, got '{}'.",
                                                titan::choice_list<titan::PipelineSchedule>(), flags.at("schedule")));
      }
    }
    pp::PipelineProgram program;
    if (flags.contains("csv")) {
      program = pp::read_pipeline_csv(flags.at("csv"), ranks, microbatches);
    } else {
      const int64_t stages =
          flags.contains("stages") ? std::stoll(flags.at("stages")) : ranks * (pp::is_single_stage(*schedule) ? 1 : 2);
      program = pp::make_pipeline_program(*schedule, ranks, stages, microbatches);
    }
    pp::validate_pipeline_program(program);
    const pp::PipelineTimeline timeline = pp::simulate_pipeline(program, costs);
    fmt::print("{}: pp {}, {} stages, {} microbatches, costs F={} B={} I={} W={}: valid\n", program.name, ranks,
               program.num_stages, microbatches, costs.forward, costs.backward, costs.backward_input,
               costs.backward_weight);
    fmt::print("{}", pp::render_timeline_text(timeline));
    std::string theory = "n/a (no --schedule)";
    if (schedule) {
      theory = fmt::format(
          "{:.1f}%", 100 * pp::theoretical_bubble(*schedule, ranks, microbatches, program.num_stages / ranks, costs));
    }
    fmt::print("bubble: simulated {:.1f}%, theoretical {}\n", 100 * pp::bubble_fraction(timeline), theory);
    if (flags.contains("svg")) {
      std::ofstream out(flags.at("svg"));
      out << pp::render_timeline_svg(timeline,
                                     fmt::format("{} pp={} microbatches={}", program.name, ranks, microbatches));
      if (!out) throw std::runtime_error(fmt::format("[titan-pp-schedule] could not write {}", flags.at("svg")));
      fmt::print("wrote {}\n", flags.at("svg"));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", titan::error_message(e));
    return 1;
  }
}
