// SPDX-License-Identifier: BSD-3-Clause
// titan-trace: reads the flight-recorder dumps of a stopped run (one <prefix><rank>.json per rank, in
// job.dump_folder/comm.save_traces_folder) and prints why each rank stopped, its last collective on
// every group, and the first place where the ranks parted. See docs/observability.md.
//   titan-trace outputs/comm_traces
// Exit status: 0 when a mismatch was found and printed, 1 on errors, 2 when the ranks agree.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <string>

#include "titan/core/error.hpp"
#include "titan/dist/flight_recorder.hpp"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    fmt::print(stderr, "usage: titan-trace <folder of flight-recorder dumps>\n");
    return argc == 2 ? 0 : 1;
  }
  try {
    const auto traces = titan::dist::read_traces(argv[1]);
    fmt::print("{} dump(s) in {}\n", traces.size(), argv[1]);
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
  } catch (const std::exception& e) {
    fmt::print(stderr, "titan-trace: {}\n", titan::error_message(e));
    return 1;
  }
}
