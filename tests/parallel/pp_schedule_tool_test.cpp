// SPDX-License-Identifier: BSD-3-Clause
// titan-pp-schedule shows a job's pipeline from the job's keys: its schedule, its degree and its microbatches
// (training.local_batch_size / parallelism.pipeline_parallel_microbatch_size), on the line or in the job's file.
#include "test_util.hpp"
#include "tool_run.hpp"

using Catch::Contains;

TEST_CASE("titan-pp-schedule draws the job's pipeline from its config keys", "[parallel][pipeline][tools]") {
  titan::test::TempDir dir;
  const auto job = dir.path / "job.toml";
  titan::test::write_file(job,
                          "[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = \"1F1B\"\n"
                          "pipeline_parallel_microbatch_size = 2\n[training]\nlocal_batch_size = 16\n");
  // 1F1B over 4 ranks and 8 microbatches: (pp - 1) / (m + pp - 1) of each rank's time at F=1, B=2 is 27.3%
  // (docs/pipeline_schedules.md shows the timeline).
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--parallelism.pipeline_parallel_schedule", "1F1B",
                                 "--parallelism.pipeline_parallel_degree", "4", "--training.local_batch_size", "8"},
        std::vector<std::string>{"--job.config_file", job.string()}}) {
    const titan::test::ToolRun run = titan::test::run_tool("titan-pp-schedule", args);
    INFO(run.output);
    CHECK(run.code == 0);
    CHECK_THAT(run.output, Contains("1F1B: pp 4, 4 stages, 8 microbatches") &&
                               Contains("bubble: simulated 27.3%, theoretical 27.3%"));
  }
  const titan::test::ToolRun old = titan::test::run_tool("titan-pp-schedule", {"--schedule", "1F1B", "--pp", "4"});
  CHECK(old.code == 1);
  CHECK_THAT(old.output,
             Contains("expected --parallelism.pipeline_parallel_schedule NAME") && Contains("got --schedule"));
  const titan::test::ToolRun one = titan::test::run_tool("titan-pp-schedule", {});
  CHECK(one.code == 1);
  CHECK_THAT(one.output, Contains("expected parallelism.pipeline_parallel_degree >= 2, got 1"));
}
