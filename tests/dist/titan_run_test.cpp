// SPDX-License-Identifier: BSD-3-Clause
// titan-run end to end: N env probes as ranks, their prefixed output, failures stopping the job.
#include "dist/launch_test_util.hpp"

#include <set>

using titan::test::check_node;
using titan::test::env_probe_path;
using titan::test::has_probes;
using titan::test::probe_lines;
using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::titan_run_path;

namespace {

// Generous: four LibTorch-linked probes starting on a loaded 2-core machine.
constexpr double kStartSeconds = 120;

std::vector<std::string> titan_run(std::vector<std::string> flags, const std::vector<std::string>& probe_args = {}) {
  flags.insert(flags.begin(), titan_run_path());
  flags.push_back("--");
  flags.push_back(env_probe_path());
  flags.insert(flags.end(), probe_args.begin(), probe_args.end());
  return flags;
}

std::vector<pid_t> probe_pids(const std::string& output) {
  std::vector<pid_t> pids;
  for (const auto& [rank, line] : probe_lines(output)) pids.push_back(static_cast<pid_t>(line.field("pid")));
  return pids;
}

void check_no_survivors(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    INFO("probe pid " << pid);
    CHECK_FALSE(titan::test::process_exists(pid));
  }
}

}  // namespace

TEST_CASE("titan-run: four ranks get the torchrun contract and prefixed output", "[dist][titan-run]") {
  Subprocess run(titan_run({"--nproc-per-node", "4"}));
  require_exit(run, 0, kStartSeconds);
  check_node(probe_lines(run.output()),
             {.first_rank = 0, .local_world_size = 4, .world_size = 4, .master_addr = "127.0.0.1"});
}

TEST_CASE("titan-run: the second node of two gets ranks 2 and 3", "[dist][titan-run]") {
  Subprocess run(titan_run({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3",
                            "--master-port=29555"}));
  require_exit(run, 0, kStartSeconds);
  check_node(probe_lines(run.output()), {.first_rank = 2,
                                         .local_world_size = 2,
                                         .world_size = 4,
                                         .group_rank = "1",
                                         .master_addr = "10.1.2.3",
                                         .master_port = 29555});
}

TEST_CASE("titan-run: lines of different ranks never mix", "[dist][titan-run]") {
  constexpr int kLines = 300;
  Subprocess run(titan_run({"--nproc-per-node", "4"}, {"--lines", std::to_string(kLines)}));
  require_exit(run, 0, kStartSeconds);
  // Each rank writes its line in two pieces; the launcher must print it whole, after the rank's prefix.
  const std::regex line_re(R"(\[rank (\d)\] line (\d+) begin ([a-z])\3{299} end)");
  std::map<std::string, std::set<int>> seen;  // rank -> line numbers
  std::istringstream in(run.output());
  for (std::string line; std::getline(in, line);) {
    if (line.find(" probe ") != std::string::npos) continue;
    std::smatch m;
    INFO(line);
    REQUIRE(std::regex_match(line, m, line_re));
    CHECK(m[3].str()[0] == 'a' + std::stoi(m[1].str()));
    seen[m[1].str()].insert(std::stoi(m[2].str()));
  }
  REQUIRE(seen.size() == 4);
  for (const auto& [rank, numbers] : seen) CHECK(numbers.size() == static_cast<std::size_t>(kLines));
}

TEST_CASE("titan-run: a rank killed by SIGKILL stops the job and names the rank", "[dist][titan-run]") {
  Subprocess run(titan_run({"--nproc-per-node", "4"}, {"--wait"}));
  REQUIRE(run.read_until(has_probes(4), kStartSeconds));
  const std::vector<pid_t> pids = probe_pids(run.output());
  const pid_t victim = static_cast<pid_t>(probe_lines(run.output()).at(2).field("pid"));
  const auto killed_at = Subprocess::Clock::now();
  REQUIRE(kill(victim, SIGKILL) == 0);
  require_exit(run, 128 + SIGKILL, 60);
  const double seconds = std::chrono::duration<double>(Subprocess::Clock::now() - killed_at).count();
  CHECK(seconds < 30);  // the survivors are stopped, not left hanging in a collective
  CHECK_THAT(run.output(),
             Catch::Contains("titan-run: rank 2 was killed by signal 9 (SIGKILL); stopped the other 3 ranks"));
  check_no_survivors(pids);
}

TEST_CASE("titan-run: ranks die with the launcher when it is killed", "[dist][titan-run]") {
  Subprocess run(titan_run({"--nproc-per-node", "2"}, {"--wait", "--ignore-term"}));
  REQUIRE(run.read_until(has_probes(2), kStartSeconds));
  const std::vector<pid_t> pids = probe_pids(run.output());
  REQUIRE(kill(run.pid(), SIGKILL) == 0);
  run.wait(60);
  // PR_SET_PDEATHSIG delivers SIGKILL to the ranks as the launcher dies; allow the kernel a moment.
  const auto deadline = Subprocess::Clock::now() + titan::test::patience(std::chrono::seconds(30));
  for (pid_t pid : pids) {
    while (titan::test::process_running(pid) && Subprocess::Clock::now() < deadline) usleep(20000);
    INFO("probe pid " << pid);
    CHECK_FALSE(titan::test::process_running(pid));
  }
}

TEST_CASE("titan-run: a failing rank's exit status is reported and returned", "[dist][titan-run]") {
  Subprocess run(titan_run({"--nproc-per-node", "4"}, {"--wait", "--fail-rank", "1", "--exit-code", "7"}));
  require_exit(run, 7, kStartSeconds);
  CHECK_THAT(run.output(), Catch::Contains("titan-run: rank 1 exited with status 7; stopped the other 3 ranks"));
  check_no_survivors(probe_pids(run.output()));
}

TEST_CASE("titan-run: ranks that ignore SIGTERM get SIGKILL after the grace period", "[dist][titan-run]") {
  Subprocess run(titan_run({"--nproc-per-node", "2", "--grace-seconds", "1"}, {"--wait", "--ignore-term"}));
  // Each probe ignores SIGTERM before it prints, so once both have printed, rank 1 will outlast SIGTERM.
  REQUIRE(run.read_until(has_probes(2), kStartSeconds));
  const std::vector<pid_t> pids = probe_pids(run.output());
  REQUIRE(kill(pids.at(0), SIGKILL) == 0);
  require_exit(run, 128 + SIGKILL, 60);
  CHECK_THAT(run.output(), Catch::Contains("titan-run: rank(s) 1 still running 1 s after SIGTERM; sent SIGKILL"));
  CHECK_THAT(run.output(),
             Catch::Contains("titan-run: rank 0 was killed by signal 9 (SIGKILL); stopped the other 1 rank\n"));
  check_no_survivors(pids);
}

TEST_CASE("titan-run: SIGINT is forwarded to the ranks", "[dist][titan-run]") {
  Subprocess run(titan_run({"--nproc-per-node", "2"}, {"--wait"}));
  REQUIRE(run.read_until(has_probes(2), kStartSeconds));
  REQUIRE(kill(run.pid(), SIGINT) == 0);
  require_exit(run, 128 + SIGINT, 60);
  CHECK_THAT(run.output(), Catch::Contains("titan-run: received SIGINT; stopped 2 running rank(s)"));
  check_no_survivors(probe_pids(run.output()));
}

TEST_CASE("titan-run: bad command lines are clear errors", "[dist][titan-run]") {
  using Args = std::vector<std::string>;
  const std::vector<std::pair<Args, std::string>> cases = {
      {{"--nproc-per-node", "0", "prog"}, "--nproc-per-node expects a number in [1, 4096], got '0'"},
      {{"--nproc-per-node", "two", "prog"}, "--nproc-per-node expects a number in [1, 4096], got 'two'"},
      {{"--grace-seconds", "nan", "prog"}, "--grace-seconds expects a number in [0, 3600], got 'nan'"},
      {{"--bogus", "prog"}, "unknown flag '--bogus'"},
      {{"--nproc-per-node", "2"}, "no program to run"},
      {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
      {{"--nnodes", "2", "--node-rank", "2", "prog"}, "--node-rank must be below --nnodes (2), got 2"},
      {{"--nnodes", "2", "--master-port", "1234", "prog"}, "--nnodes > 1 needs --master-addr"},
  };
  for (const auto& [args, message] : cases) {
    Args argv{titan_run_path()};
    argv.insert(argv.end(), args.begin(), args.end());
    Subprocess run(argv);
    require_exit(run, 2, 60);
    CHECK_THAT(run.output(), Catch::StartsWith("titan-run: " + message));
  }
  Subprocess help({titan_run_path(), "--help"});
  require_exit(help, 0, 60);
  CHECK_THAT(help.output(), Catch::StartsWith("usage: titan-run --nproc-per-node N"));
}

TEST_CASE("titan-run: a loopback rendezvous address for several nodes is warned about", "[dist][titan-run]") {
  using Args = std::vector<std::string>;
  // Node 1 of 2 (its probe needs no rank 0 to print its line): the warning, and the job runs as asked.
  for (const std::string address : {"127.0.0.1", "127.0.1.1", "::1", "localhost", "LocalHost."}) {
    INFO(address);
    Subprocess run(
        titan_run({"--nnodes", "2", "--node-rank", "1", "--master-addr", address, "--master-port", "29555"}));
    require_exit(run, 0, kStartSeconds);
    CHECK_THAT(run.output(),
               Catch::StartsWith("titan-run: warning: --master-addr " + address +
                                 " is loopback: the other nodes of --nnodes 2 cannot reach it unless every node runs "
                                 "on this machine. Pass an address of rank 0's host that the other hosts reach."));
    CHECK(probe_lines(run.output()).size() == 1);
  }
  // Elastic, the same for the rendezvous address (this agent hosts it and, MIN being 1, runs alone).
  Subprocess elastic(titan_run(
      {"--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29556", "--rdzv-conf", "join_timeout=10,last_call_timeout=0"}));
  require_exit(elastic, 0, kStartSeconds);
  CHECK_THAT(elastic.output(),
             Catch::StartsWith("titan-run: warning: the rendezvous address 127.0.0.1 is loopback: the "
                               "other nodes of --nnodes 1:2 cannot reach it unless every node runs on "
                               "this machine. Pass an address of the rendezvous host"));
  // No warning for one node on loopback, or for several nodes at an address other hosts may reach.
  for (const Args& flags :
       {Args{"--master-addr", "127.0.0.1"},
        Args{"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port", "29555"},
        Args{"--nnodes", "1:1", "--rdzv-endpoint", "127.0.0.1:29557"}}) {
    Subprocess run(titan_run(flags));
    require_exit(run, 0, kStartSeconds);
    CHECK_THAT(run.output(), !Catch::Contains("warning"));
  }
}

TEST_CASE("titan-run: a program that cannot start fails every rank with 127", "[dist][titan-run]") {
  Subprocess run({titan_run_path(), "--nproc-per-node", "2", "--", "/nonexistent/titan-program"});
  require_exit(run, 127, 60);
  CHECK_THAT(run.output(), Catch::Contains("titan-run: cannot run '/nonexistent/titan-program': No such file"));
  CHECK_THAT(run.output(), Catch::Contains("exited with status 127"));
}
