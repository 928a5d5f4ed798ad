// SPDX-License-Identifier: BSD-3-Clause
// metrics.save_for_all_ranks under titan-run: 2 FSDP processes each write an event file and a W&B run below
// one timestamped folder, in rank_0 and rank_1; the tensorboard package and the wandb package read them. Rank
// 0's equal metrics.jsonl (rank 0's) value for value; rank 1's have the same tags and steps, and the same
// global loss, grad norm and learning rate (its tps and memory are its own). WANDB_RUN_ID gets each rank's
// suffix, so the two runs upload as two; WANDB_DIR moves the runs (to <WANDB_DIR>/rank_<r>/wandb/).
#include <fmt/format.h>

#include <vector>

#include "dist/launch_test_util.hpp"

namespace fs = std::filesystem;
using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;

TEST_CASE("TensorBoard and W&B: save_for_all_ranks writes rank_0 and rank_1 event files and runs under titan-run",
          "[dist][launch][train][tensorboard][wandb][full]") {
  TempDir dump;
  Subprocess run(titan::test::fsdp2_debug_job(dump.path.string(), 3,
                                              {"--metrics.log_freq", "1", "--metrics.enable_tensorboard",
                                               "--metrics.enable_wandb", "--metrics.save_for_all_ranks"}),
                 {{"TITAN_LOG_LEVEL", "info"},
                  {"WANDB_MODE", "offline"},
                  {"WANDB_RUN_ID", "fsdp2"},
                  {"WANDB_DIR", (dump.path / "wandb_dir").string()}});
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
  for (const int rank : {0, 1}) {
    std::vector<fs::path> wandb_runs;
    for (const auto& entry : fs::directory_iterator(dump.path / "wandb_dir" / fmt::format("rank_{}", rank) / "wandb")) {
      if (entry.path().filename().string().starts_with("offline-run-")) wandb_runs.push_back(entry.path());
    }
    REQUIRE(wandb_runs.size() == 1);
    CHECK(wandb_runs[0].filename().string().ends_with(fmt::format("-fsdp2-rank{}", rank)));
    REQUIRE(titan::test::run_python(
                "wandb_run.py",
                fmt::format("run \"{}\" \"{}\" --run-id=fsdp2-rank{} --min-steps=3 {}", wandb_runs[0].string(), jsonl,
                            rank, rank == 0 ? "" : "--keys=loss_metrics/global_avg_loss,grad_norm,lr")) == 0);
  }
}
