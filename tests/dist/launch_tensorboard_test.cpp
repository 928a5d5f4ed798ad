// SPDX-License-Identifier: BSD-3-Clause
// metrics.save_for_all_ranks under titan-run: 2 FSDP processes each write an event file below one
// timestamped folder, in rank_0 and rank_1; the tensorboard package reads both. Rank 0's file equals
// metrics.jsonl (rank 0's) scalar for scalar; rank 1's has the same tags and steps, and the same
// global loss, grad norm and learning rate (its tps and memory are its own).
#include <fmt/format.h>

#include <vector>

#include "dist/launch_test_util.hpp"

namespace fs = std::filesystem;
using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;

TEST_CASE("TensorBoard: save_for_all_ranks writes rank_0 and rank_1 event files under titan-run",
          "[dist][launch][train][tensorboard][full]") {
  TempDir dump;
  Subprocess run(titan::test::fsdp2_debug_job(
                     dump.path.string(), 3,
                     {"--metrics.log_freq", "1", "--metrics.enable_tensorboard", "--metrics.save_for_all_ranks"}),
                 {{"TITAN_LOG_LEVEL", "info"}});
  require_exit(run, 0, 600);
  CHECK_THAT(run.output(), Catch::Contains("step:   3/3 \u00b7 ETA 0s"));
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(dump.path / "tb")) runs.push_back(entry.path());
  REQUIRE(runs.size() == 1);  // one timestamp agreed by both ranks
  const std::string jsonl = (dump.path / "metrics.jsonl").string();
  REQUIRE(titan::test::run_python("tensorboard_events.py",
                                  fmt::format("\"{}\" \"{}\"", (runs[0] / "rank_0").string(), jsonl)) == 0);
  REQUIRE(titan::test::run_python("tensorboard_events.py",
                                  fmt::format("\"{}\" \"{}\" loss_metrics/global_avg_loss,grad_norm,lr",
                                              (runs[0] / "rank_1").string(), jsonl)) == 0);
}
