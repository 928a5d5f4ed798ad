// SPDX-License-Identifier: BSD-3-Clause
// titan-run --nnodes MIN:MAX: several titan-run agents on this machine stand for the nodes of a job. They
// meet at one rendezvous address; a lost node's job starts again on the nodes left with WORLD_SIZE
// recomputed and the ranks renumbered, a node joining below MAX makes the job start again with it, and
// a loss past --max-restarts ends the job. The ranks are env probes (tests/dist/env_probe.cpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "dist/launch_test_util.hpp"

using Catch::Matchers::Contains;
using titan::test::exit_code;
using titan::test::probe_lines;
using titan::test::ProbeLine;
using titan::test::Subprocess;

namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// One node's agent: 2 probe ranks that wait on the job's first start and exit 0 after a restart.
std::vector<std::string> agent(const std::string& nnodes, int port, int max_restarts) {
  return {titan::test::titan_run_path(),
          "--nnodes",
          nnodes,
          "--nproc-per-node",
          "2",
          "--rdzv-endpoint",
          "127.0.0.1:" + std::to_string(port),
          "--rdzv-conf",
          "join_timeout=20,last_call_timeout=1",
          "--max-restarts",
          std::to_string(max_restarts),
          "--failure-grace-seconds",
          "0.5",
          "--",
          titan::test::env_probe_path(),
          "--wait-first"};
}

// The probe lines of one start of the job (TITAN_RESTART_COUNT = restart), keyed by rank.
std::map<long, ProbeLine> started(const std::string& output, long restart) {
  std::map<long, ProbeLine> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    for (const auto& [rank, probe] : probe_lines(line)) {
      if (probe.field("restart") == restart) out[rank] = probe;
    }
  }
  return out;
}

auto has(const std::string& text) {
  return [text](const std::string& output) { return output.find(text) != std::string::npos; };
}

auto probes_of(long restart, std::size_t n) {
  return [restart, n](const std::string& output) { return started(output, restart).size() >= n; };
}

// The node's ranks in one start: `first`, first + 1, world size `world`, all on one store port.
void check_ranks(const std::map<long, ProbeLine>& lines, long first, long world) {
  REQUIRE(lines.size() == 2);
  for (long local = 0; local < 2; ++local) {
    INFO("rank " << first + local);
    REQUIRE(lines.count(first + local) == 1);
    const ProbeLine& p = lines.at(first + local);
    CHECK(p.field("local_rank") == local);
    CHECK(p.field("world_size") == world);
    CHECK(p.fields.at("group_rank") == std::to_string(first / 2));
    CHECK(p.fields.at("master_addr") == "127.0.0.1");
  }
}

}  // namespace

TEST_CASE("titan-run --nnodes MIN:MAX: the elastic flags and their errors", "[launch][titan-run][elastic]") {
  const auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), titan::test::titan_run_path());
    Subprocess p(args);
    const auto status = p.wait(10);
    REQUIRE(status);
    return std::pair{exit_code(*status), p.output()};
  };
  const std::string probe = titan::test::env_probe_path();
  auto [code, out] = run({"--nnodes", "3:2", "--master-port", "29400", probe});
  CHECK(code == 2);
  CHECK_THAT(out, Contains("--nnodes MIN:MAX expects MIN <= MAX, got '3:2'"));
  std::tie(code, out) = run({"--nnodes", "1:2", probe});
  CHECK(code == 2);
  CHECK_THAT(out, Contains("--nnodes MIN:MAX needs --master-port (or --rdzv-endpoint HOST:PORT)"));
  std::tie(code, out) = run({"--nnodes", "1:2", "--node-rank", "1", "--master-port", "29400", probe});
  CHECK(code == 2);
  CHECK_THAT(out, Contains("--node-rank is set by the rendezvous"));
  std::tie(code, out) =
      run({"--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-conf", "timeout=3", probe});
  CHECK(code == 2);
  CHECK_THAT(out, Contains("--rdzv-conf knows join_timeout, last_call_timeout, keep_alive_interval and "
                           "keep_alive_max_attempt, got 'timeout=3'"));
  std::tie(code, out) =
      run({"--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-conf", "keep_alive_interval=0", probe});
  CHECK(code == 2);
  CHECK_THAT(out, Contains("--rdzv-conf keep_alive_interval expects a number in [1, 3600], got '0'"));
  std::tie(code, out) = run({"--nnodes", "1:x", "--master-port", "29400", probe});
  CHECK(code == 2);
  CHECK_THAT(out, Contains("--nnodes MAX expects a number"));
  // One agent of --nnodes 1:1 is a whole job: it hosts the rendezvous and runs its ranks.
  const int port = free_port();
  std::tie(code, out) = run({"--nnodes", "1:1", "--nproc-per-node", "2", "--master-port", std::to_string(port), probe});
  CHECK(code == 0);
  CHECK_THAT(out, Contains("starting the job on 1 node(s), world size 2; this node is node 0 (ranks 0-1)"));
  check_ranks(started(out, 0), 0, 2);
}

TEST_CASE("elastic titan-run: a lost node's job restarts on the nodes left with the ranks renumbered",
          "[launch][titan-run][elastic]") {
  const int port = free_port();
  // Three nodes of 2 ranks; node 1 is lost (its titan-run SIGKILLed); nodes 0 and 2 go on as 0 and 1.
  Subprocess host(agent("2:3", port, 1));
  REQUIRE(host.read_until(has("hosting the elastic rendezvous at 127.0.0.1:" + std::to_string(port)), 10));
  Subprocess lost(agent("2:3", port, 1));
  REQUIRE(lost.read_until(has("joined the elastic rendezvous"), 10));
  Subprocess last(agent("2:3", port, 1));
  // MAX nodes ready: the round starts without waiting for the last call.
  REQUIRE(host.read_until(probes_of(0, 2), 10));
  REQUIRE(lost.read_until(probes_of(0, 2), 10));
  REQUIRE(last.read_until(probes_of(0, 2), 10));
  check_ranks(started(host.output(), 0), 0, 6);
  check_ranks(started(lost.output(), 0), 2, 6);
  check_ranks(started(last.output(), 0), 4, 6);
  CHECK_THAT(last.output(), Contains("starting the job on 3 node(s), world size 6; this node is node 2 (ranks 4-5)"));

  kill(lost.pid(), SIGKILL);  // the node is gone; its ranks die with their titan-run (PR_SET_PDEATHSIG)
  for (Subprocess* node : {&host, &last}) {
    const auto status = node->wait(20);
    INFO(node->output());
    REQUIRE(status);
    CHECK(exit_code(*status) == 0);  // the restarted probes exit 0: the job completed on 2 nodes
    CHECK_THAT(node->output(), Contains("after node 1 was lost (its titan-run stopped answering)"));
  }
  CHECK_THAT(host.output(),
             Contains("restarting the job (restart 1) on 2 node(s), world size 4; this node is node 0 (ranks 0-1)"));
  CHECK_THAT(last.output(),
             Contains("restarting the job (restart 1) on 2 node(s), world size 4; this node is node 1 (ranks 2-3)"));
  check_ranks(started(host.output(), 1), 0, 4);
  check_ranks(started(last.output(), 1), 2, 4);  // ranks 4-5 renumbered 2-3
  // The restarted ranks share one new store port, on the host's address.
  const long port0 = started(host.output(), 1).at(0).field("master_port");
  CHECK(started(last.output(), 1).at(2).field("master_port") == port0);
  CHECK(port0 != started(host.output(), 0).at(0).field("master_port"));
}

TEST_CASE("elastic titan-run: a node joining below MAX restarts the job with it and a loss past --max-restarts ends it",
          "[launch][titan-run][elastic]") {
  SECTION("grow") {
    const int port = free_port();
    Subprocess host(agent("1:2", port, 0));
    // MIN is 1: after the 1 s last call the host starts alone.
    REQUIRE(host.read_until(probes_of(0, 2), 10));
    check_ranks(started(host.output(), 0), 0, 2);
    Subprocess joining(agent("1:2", port, 0));
    const auto status = joining.wait(20);
    INFO(joining.output());
    REQUIRE(status);
    CHECK(exit_code(*status) == 0);
    REQUIRE(host.wait(10));
    CHECK_THAT(host.output(),
               Contains("restarting the job (restart 1) on 2 node(s), world size 4; this node is node 0 (ranks 0-1) "
                        "after 1 node(s) joined"));
    check_ranks(started(host.output(), 1), 0, 4);
    check_ranks(started(joining.output(), 1), 2, 4);
  }
  SECTION("no restarts left") {
    const int port = free_port();
    Subprocess host(agent("1:2", port, 0));
    REQUIRE(host.read_until(has("hosting the elastic rendezvous"), 10));
    Subprocess lost(agent("1:2", port, 0));
    REQUIRE(host.read_until(probes_of(0, 2), 10));
    REQUIRE(lost.read_until(probes_of(0, 2), 10));
    kill(lost.pid(), SIGKILL);
    const auto status = host.wait(20);
    INFO(host.output());
    REQUIRE(status);
    CHECK(exit_code(*status) == 1);
    CHECK_THAT(host.output(), Contains("node 1 was lost (its titan-run stopped answering); exit status 1"));
    CHECK(started(host.output(), 1).empty());
  }
}
