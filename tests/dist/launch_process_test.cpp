// SPDX-License-Identifier: BSD-3-Clause
// The env probe as a real process: under pip torch's torchrun, and with a broken contract.
#include "dist/launch_test_util.hpp"

using titan::test::env_probe_path;
using titan::test::probe_lines;
using titan::test::require_exit;
using titan::test::Subprocess;

TEST_CASE("torchrun: two probe ranks read torchrun's environment", "[dist][torchrun][full]") {
  // python -m torch.distributed.run is torchrun; --no-python runs our executable as the worker.
  Subprocess run({titan::test::python(), "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                  "--no-python", env_probe_path()},
                 {{"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"OMP_NUM_THREADS", "1"}});
  require_exit(run, 0, 300);
  titan::test::check_node(probe_lines(run.output()),
                          {.first_rank = 0, .local_world_size = 2, .world_size = 2, .prefixed = false});
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
    require_exit(probe, 3, 120);
    CHECK_THAT(probe.output(), Catch::StartsWith(message));
  }
}
