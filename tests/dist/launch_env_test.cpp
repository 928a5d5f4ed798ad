// SPDX-License-Identifier: BSD-3-Clause
// read_launch_env against fake environments: torchrun's contract, Slurm's, none, and the mistakes.
#include <catch2/catch.hpp>

#include "titan/core/error.hpp"
#include "titan/dist/launch_env.hpp"

#include <map>

using titan::dist::LaunchEnv;
using titan::dist::read_launch_env;

namespace {

using Vars = std::map<std::string, std::string>;

LaunchEnv read(const Vars& vars) {
  return read_launch_env([&vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// The message read_launch_env throws for `vars`, without LibTorch's backtrace ("" when it does not throw).
std::string error_of(const Vars& vars) {
  try {
    read(vars);
  } catch (const c10::ValueError& e) {
    return titan::error_message(e);
  }
  return "";
}

const Vars kTorchrun{{"RANK", "5"},
                     {"LOCAL_RANK", "1"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_WORLD_SIZE", "4"},
                     {"MASTER_ADDR", "10.0.0.7"},
                     {"MASTER_PORT", "29500"}};

Vars with(Vars vars, const std::string& name, const std::string& value) {
  vars[name] = value;
  return vars;
}

Vars without(Vars vars, const std::string& name) {
  vars.erase(name);
  return vars;
}

void check_env(const LaunchEnv& got, const LaunchEnv& want) {
  CHECK(got.rank == want.rank);
  CHECK(got.local_rank == want.local_rank);
  CHECK(got.world_size == want.world_size);
  CHECK(got.local_world_size == want.local_world_size);
  CHECK(got.master_addr == want.master_addr);
  CHECK(got.master_port == want.master_port);
  CHECK(got.source == want.source);
}

}  // namespace

TEST_CASE("read_launch_env: no launcher means one process", "[dist][launch_env]") {
  // MASTER_PORT and a job id alone (an sbatch script outside srun) are not a launch.
  check_env(read({{"MASTER_PORT", "1234"}, {"SLURM_JOB_ID", "77"}}), LaunchEnv{});
  CHECK(LaunchEnv{}.source == "none");
  CHECK(LaunchEnv{}.world_size == 1);
}

TEST_CASE("read_launch_env: the torchrun contract", "[dist][launch_env]") {
  check_env(read(kTorchrun), {.rank = 5,
                              .local_rank = 1,
                              .world_size = 8,
                              .local_world_size = 4,
                              .master_addr = "10.0.0.7",
                              .master_port = 29500,
                              .source = "torchrun"});
}

TEST_CASE("read_launch_env: torchrun wins over Slurm when both are set", "[dist][launch_env]") {
  Vars vars = kTorchrun;
  vars.insert({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
  CHECK(read(vars).source == "torchrun");
  CHECK(read(vars).rank == 5);
}

TEST_CASE("read_launch_env: a hand-written single-node contract fills the local pair", "[dist][launch_env]") {
  const LaunchEnv env = read({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "29400"}});
  CHECK(env.local_rank == 3);
  CHECK(env.local_world_size == 4);
  CHECK(env.master_addr == "127.0.0.1");
  // One rank needs no rendezvous, so no port.
  CHECK(read({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).master_port == 0);
}

TEST_CASE("read_launch_env: torchrun mistakes are named", "[dist][launch_env]") {
  CHECK_THAT(error_of(without(kTorchrun, "MASTER_PORT")),
             Catch::StartsWith("[titan::dist::read_launch_env] expected MASTER_PORT to be set because WORLD_SIZE is 8, "
                               "got it unset."));
  CHECK_THAT(error_of(with(kTorchrun, "RANK", "8")),
             Catch::StartsWith("[titan::dist::read_launch_env] expected 0 <= RANK < WORLD_SIZE (8), got 8."));
  CHECK_THAT(error_of(with(kTorchrun, "WORLD_SIZE", "0")), Catch::Contains("expected WORLD_SIZE >= 1, got 0"));
  CHECK_THAT(error_of(with(kTorchrun, "WORLD_SIZE", "4x")),
             Catch::StartsWith("[titan::dist::read_launch_env] expected WORLD_SIZE to be an integer, got '4x'."));
  CHECK_THAT(error_of(with(kTorchrun, "LOCAL_RANK", "")), Catch::Contains("expected LOCAL_RANK to be an integer"));
  CHECK_THAT(error_of(with(kTorchrun, "MASTER_PORT", "http")),
             Catch::Contains("expected MASTER_PORT to be an integer"));
  CHECK_THAT(error_of(with(kTorchrun, "MASTER_PORT", "70000")),
             Catch::Contains("expected MASTER_PORT in [1, 65535], got 70000"));
  CHECK_THAT(error_of(with(kTorchrun, "LOCAL_RANK", "4")),
             Catch::Contains("expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE (4), got 4"));
  CHECK_THAT(error_of(with(kTorchrun, "LOCAL_WORLD_SIZE", "9")),
             Catch::Contains("expected 1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE (8), got 9"));
}

TEST_CASE("read_launch_env: a partial torchrun contract is an error", "[dist][launch_env]") {
  CHECK_THAT(error_of({{"RANK", "0"}}), Catch::Contains("got WORLD_SIZE unset"));
  CHECK_THAT(error_of({{"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}), Catch::Contains("got RANK unset"));
  CHECK_THAT(error_of({{"LOCAL_RANK", "0"}}), Catch::Contains("got RANK and WORLD_SIZE unset"));
}

TEST_CASE("read_launch_env: the Slurm contract", "[dist][launch_env]") {
  const Vars slurm{{"SLURM_PROCID", "6"},
                   {"SLURM_NTASKS", "8"},
                   {"SLURM_LOCALID", "2"},
                   {"SLURM_NODEID", "1"},
                   {"SLURM_JOB_ID", "123456"},
                   {"SLURM_TASKS_PER_NODE", "4(x2)"},
                   {"SLURM_JOB_NODELIST", "gpu-[007-008]"}};
  check_env(read(slurm), {.rank = 6,
                          .local_rank = 2,
                          .world_size = 8,
                          .local_world_size = 4,
                          .master_addr = "gpu-007",
                          .master_port = 20000 + 3456,
                          .source = "slurm"});
  CHECK(titan::dist::slurm_default_port(123456) == 23456);

  // The user's MASTER_ADDR/MASTER_PORT and --ntasks-per-node win over what is derived.
  Vars explicit_vars = slurm;
  explicit_vars.insert({{"MASTER_ADDR", "head"}, {"MASTER_PORT", "29511"}, {"SLURM_NTASKS_PER_NODE", "4"}});
  const LaunchEnv explicit_env = read(explicit_vars);
  CHECK(explicit_env.master_addr == "head");
  CHECK(explicit_env.master_port == 29511);

  // Uneven nodes: this node's entry of the per-node list.
  CHECK(read(with(with(slurm, "SLURM_TASKS_PER_NODE", "5,3"), "SLURM_LOCALID", "0")).local_world_size == 3);
  // Nothing per node: an even split over the nodes.
  CHECK(read(with(without(slurm, "SLURM_TASKS_PER_NODE"), "SLURM_NNODES", "2")).local_world_size == 4);
  CHECK(read(without(slurm, "SLURM_TASKS_PER_NODE")).local_world_size == 8);
}

TEST_CASE("read_launch_env: Slurm mistakes are named", "[dist][launch_env]") {
  const Vars slurm{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODELIST", "n1"}};
  CHECK_THAT(error_of(without(slurm, "SLURM_NTASKS")),
             Catch::Contains("expected SLURM_NTASKS to be set because SLURM_PROCID is set"));
  CHECK_THAT(error_of(slurm),
             Catch::Contains("expected MASTER_PORT or SLURM_JOB_ID to be set because SLURM_NTASKS is 2"));
  CHECK_THAT(error_of(with(with(slurm, "MASTER_PORT", "1"), "SLURM_PROCID", "2")),
             Catch::Contains("expected 0 <= SLURM_PROCID < SLURM_NTASKS (2), got 2"));
  CHECK_THAT(error_of(with(with(slurm, "MASTER_PORT", "1"), "SLURM_NNODES", "3")),
             Catch::Contains("expected SLURM_NTASKS (2) to split evenly over SLURM_NNODES (3)"));
  CHECK_THAT(error_of(with(without(slurm, "SLURM_NODELIST"), "MASTER_PORT", "1")),
             Catch::Contains("expected SLURM_JOB_NODELIST or MASTER_ADDR to be set"));
}

TEST_CASE("expand_slurm_nodelist: ranges padding and products", "[dist][launch_env]") {
  using titan::dist::expand_slurm_nodelist;
  using List = std::vector<std::string>;
  CHECK(expand_slurm_nodelist("node[01-04,07]") == List{"node01", "node02", "node03", "node04", "node07"});
  CHECK(expand_slurm_nodelist("a1,b[8-10],c") == List{"a1", "b8", "b9", "b10", "c"});
  CHECK(expand_slurm_nodelist("n[098-100]") == List{"n098", "n099", "n100"});
  CHECK(expand_slurm_nodelist("r[1-2]n[3,5]-ib") == List{"r1n3-ib", "r1n5-ib", "r2n3-ib", "r2n5-ib"});
  CHECK(expand_slurm_nodelist("login") == List{"login"});
  CHECK_THROWS_AS(expand_slurm_nodelist("node[01-04"), c10::ValueError);
  CHECK_THROWS_AS(expand_slurm_nodelist("node[4-1]"), c10::ValueError);
  CHECK_THROWS_AS(expand_slurm_nodelist("node[a-b]"), c10::ValueError);
  CHECK_THROWS_AS(expand_slurm_nodelist("a,,b"), c10::ValueError);
}

TEST_CASE("expand_slurm_tasks_per_node: repeats", "[dist][launch_env]") {
  using titan::dist::expand_slurm_tasks_per_node;
  CHECK(expand_slurm_tasks_per_node("4(x2),3") == std::vector<int64_t>{4, 4, 3});
  CHECK(expand_slurm_tasks_per_node("8") == std::vector<int64_t>{8});
  CHECK_THROWS_AS(expand_slurm_tasks_per_node("4(x2"), c10::ValueError);
  CHECK_THROWS_AS(expand_slurm_tasks_per_node("0"), c10::ValueError);
}
