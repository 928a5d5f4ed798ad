// SPDX-License-Identifier: BSD-3-Clause
// profiling.* under titan-run, 2 FSDP processes: every rank writes torchtitan's
// profile_traces/iteration_<step>/rank<r>_trace.json (Kineto's Chrome trace: aten::mm, titan's ranges,
// FSDP all-gathers before their unit's compute) and memory_snapshot/iteration_<step>/rank<r>_memory_snapshot.json
// (titan's CPU timeline), whose per-step peaks equal what metrics.jsonl reports.
#include <fmt/format.h>

#include <vector>

#include "dist/launch_test_util.hpp"

namespace fs = std::filesystem;
using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;

TEST_CASE("Profiling: titan-run FSDP ranks write Chrome traces and CPU memory timelines matching the metrics",
          "[dist][launch][train][profiler][full]") {
  TempDir dump;
  Subprocess run(titan::test::fsdp2_debug_job(
                     dump.path.string(), 4,
                     {"--metrics.log_freq", "1", "--profiling.enable_profiling", "--profiling.profile_freq", "2",
                      "--profiling.profiler_warmup", "1", "--profiling.enable_memory_snapshot"}),
                 {{"TITAN_LOG_LEVEL", "info"}});
  require_exit(run, 0, 600);
  std::string traces;
  for (const int step : {2, 4}) {
    for (const int rank : {0, 1}) {
      const fs::path trace =
          dump.path / "profile_traces" / fmt::format("iteration_{}", step) / fmt::format("rank{}_trace.json", rank);
      REQUIRE(fs::exists(trace));
      traces += fmt::format(" \"{}\"", trace.string());
    }
  }
  // Only the recorded steps have traces (profile_freq 2: steps 2 and 4).
  CHECK_FALSE(fs::exists(dump.path / "profile_traces" / "iteration_1"));
  CHECK_FALSE(fs::exists(dump.path / "profile_traces" / "iteration_3"));
  CHECK(titan::test::run_python("profile_trace.py",
                                "--require ProfilerStep# --require titan::data_loading --require titan::backward "
                                "--require titan::optimizer_step --require \"FSDP::reduce_scatter \"" +
                                    traces) == 0);
  for (const int rank : {0, 1}) {
    std::string timelines;
    for (const int step : {2, 4}) {
      const fs::path t = dump.path / "memory_snapshot" / fmt::format("iteration_{}", step) /
                         fmt::format("rank{}_memory_snapshot.json", rank);
      REQUIRE(fs::exists(t));
      timelines += fmt::format(" \"{}\"", t.string());
    }
    // metrics.jsonl is rank 0's: its peaks are compared with rank 0's timeline.
    const std::string metrics =
        rank == 0 ? fmt::format("--metrics \"{}\"", (dump.path / "metrics.jsonl").string()) : std::string();
    CHECK(titan::test::run_python("memory_timeline.py", metrics + timelines) == 0);
  }
}
