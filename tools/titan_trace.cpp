// SPDX-License-Identifier: BSD-3-Clause
// titan-trace: reads the flight-recorder dumps of a stopped run (one <prefix><rank>.json per rank, in
// job.dump_folder/comm.save_traces_folder) and prints why each rank stopped, its last collective on
// every group, and the first place where the ranks parted. See docs/observability.md.
//   titan-trace outputs/comm_traces
//   titan-trace --job.config_file run.toml      (the job's job.dump_folder/comm.save_traces_folder)
// Exit status: 0 when a mismatch was found and printed, 1 on errors, 2 when the ranks agree.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>
#include <string>

#include "titan/core/error.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/dist/flight_recorder.hpp"

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-trace",
    .usage =
        "usage: titan-trace [FOLDER]\n"
        "  FOLDER: the flight-recorder dumps; default: the job's job.dump_folder/comm.save_traces_folder\n",
    .keys = "job.dump_folder, comm.save_traces_folder (the folder when none is named)",
    .words = "the folder of dumps"};

}  // namespace

int main(int argc, char** argv) {
  return titan::run_tool(kSpec, argc, argv, [&](const titan::ToolArgs& args) {
    TITAN_CHECK_VALUE(args.words.size() <= 1, "[titan-trace] expected one folder of dumps, got {}: {}.",
                      args.words.size(), fmt::join(args.words, " "));
    const titan::JobConfig& config = args.config;
    const std::string folder =
        args.words.empty() ? (std::filesystem::path(config.job.dump_folder) / config.comm.save_traces_folder).string()
                           : args.words[0];
    const auto traces = titan::dist::read_traces(folder);
    fmt::print("{} dump(s) in {}\n", traces.size(), folder);
    for (const auto& t : traces) {
      fmt::print("rank {}: {} collectives recorded; stopped because: {}\n", t.rank, t.entries.size(), t.reason);
      std::map<std::string, const titan::dist::TraceEntry*> last;
      for (const auto& e : t.entries) last[e.group] = &e;
      for (const auto& [group, e] : last) {
        fmt::print("  group '{}': last seq {} {} [{}] {} ({})\n", group, e->seq, e->op, fmt::join(e->sizes, ", "),
                   e->dtype, titan::dist::to_string(e->state));
      }
    }
    if (const auto mismatch = titan::dist::find_first_mismatch(traces)) {
      fmt::print("first mismatch: {}\n", *mismatch);
      return 0;
    }
    fmt::print("no mismatch: every group's ranks issued the same collectives and all completed\n");
    return 2;
  });
}
