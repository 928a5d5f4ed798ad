// SPDX-License-Identifier: BSD-3-Clause
// The env probe as a real process: under pip torch's torchrun, and with a broken contract.
#include "dist/launch_test_util.hpp"

using titan::test::env_probe_path;
using titan::test::exit_code;
using titan::test::probe_lines;
using titan::test::Subprocess;

TEST_CASE("torchrun: two probe ranks read torchrun's environment", "[dist][torchrun]") {
  // python -m torch.distributed.run is torchrun; --no-python runs our executable as the worker.
  Subprocess run({TITAN_TEST_PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                  "--no-python", env_probe_path()},
                 {{"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"OMP_NUM_THREADS", "1"}});
  const auto status = run.wait(300);
  INFO(run.output());
  REQUIRE(status);
  CHECK(exit_code(*status) == 0);
  const auto lines = probe_lines(run.output());
  REQUIRE(lines.size() == 2);
  const long port = lines.at(0).field("master_port");
  CHECK(port > 0);
  for (long rank = 0; rank < 2; ++rank) {
    const auto& line = lines.at(rank);
    CHECK(line.field("local_rank") == rank);
    CHECK(line.field("world_size") == 2);
    CHECK(line.field("local_world_size") == 2);
    CHECK(line.field("master_port") == port);
    CHECK(line.fields.at("source") == "torchrun");
    CHECK(line.fields.at("group_rank") == "0");
  }
}

TEST_CASE("read_launch_env in a process: missing MASTER_PORT and a wrong WORLD_SIZE are clear errors",
          "[dist][launch_env]") {
  const std::vector<std::pair<std::map<std::string, std::optional<std::string>>, std::string>> cases = {
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", std::nullopt}},
       "[titan::dist::read_launch_env] expected MASTER_PORT to be set because WORLD_SIZE is 2, got it unset."},
      {{{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29500"}},
       "[titan::dist::read_launch_env] expected 0 <= RANK < WORLD_SIZE (4), got 4."},
  };
  for (const auto& [env, message] : cases) {
    Subprocess probe({env_probe_path()}, env);
    const auto status = probe.wait(120);
    INFO(probe.output());
    REQUIRE(status);
    CHECK(exit_code(*status) == 3);
    CHECK_THAT(probe.output(), Catch::StartsWith(message));
  }
}
