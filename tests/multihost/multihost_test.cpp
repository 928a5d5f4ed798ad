// SPDX-License-Identifier: BSD-3-Clause
// Several hosts on one machine: tests/multihost/netns.sh gives each "host" a network namespace of its own
// (its own interfaces, addresses, ports and routes) on a private bridge, and a titan-run per host runs
// the job there over real interfaces instead of loopback. FSDP 4 (over IPv4 and IPv6) and HSDP 2 x FSDP 2
// over 2 hosts x 2 ranks reproduce one process's losses, a checkpoint written on 2 hosts resumes on one and back, the
// errors a user meets first (a wrong GLOO_SOCKET_IFNAME, an unreachable master, a taken port) come
// within a minute naming the culprit, torchrun's multi-node rendezvous runs the same job, and elastic
// titan-run that loses one of 3 hosts goes on with 2 from the checkpoint and takes the host back when its
// agent returns. A host whose cable is pulled (its veth end on the bridge down) is named with its ranks
// and address within the collective timeout + 10 s while its own ranks name the store they lost, and
// every process of the job exits; an elastic agent cut off from the rendezvous stops its ranks and
// leaves. After each test no namespace, link or process of it remains. Needs root: without it the tests
// fail saying so.
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <regex>

#include "dist/launch_test_util.hpp"
#include "titan/dist/flight_recorder.hpp"

using Catch::Matchers::Contains;
using titan::test::exit_code;
using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string netns_script() { return (titan::test::test_dir() / "multihost" / "netns.sh").string(); }

std::string ip_path() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  FAIL(
      "the multi-host tests need iproute2's `ip` (apt-get install iproute2); found none in /usr/sbin, /sbin, "
      "/usr/bin or /bin");
  return "";
}

using titan::test::concat;

// Hosts 0..n-1 of a private network, held by `netns.sh hold` for the test's life; host k has addresses
// 198.18.0.(k+1) and fd00:7e57::(k+1) on interface tn0. close() takes them down and checks that nothing of them
// remains.
class Hosts {
 public:
  explicit Hosts(int n)
      : holder_({"/bin/bash", netns_script(), "hold", std::to_string(n)}, {{"TMPDIR", state_.path.string()}}) {
    const bool up =
        holder_.read_until([](const std::string& out) { return out.find("ready ") != std::string::npos; }, 30);
    INFO("netns.sh hold " << n << ":\n" << holder_.output());
    REQUIRE(up);  // its output says why (no root, no namespaces in this container, ...)
    const std::size_t at = holder_.output().find("ready ") + 6;
    tag_ = holder_.output().substr(at, holder_.output().find('\n', at) - at);
  }
  ~Hosts() {
    if (!closed_) stop();
  }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  static std::string address(int k) { return "198.18.0." + std::to_string(k + 1); }
  std::string name(int k) const { return "titan-mh-" + tag_ + "-" + std::to_string(k); }

  // `argv` run on host k.
  std::vector<std::string> on(int k, const std::vector<std::string>& argv) const {
    return concat({ip_path(), "netns", "exec", name(k)}, argv);
  }

  // Pulls host k's cable (up = false) or plugs it back: its veth end on the bridge goes down, so the host
  // keeps its address and routes but nothing reaches it and nothing it sends arrives; no reset, no error.
  void set_link(int k, bool up) const {
    Subprocess link(
        {ip_path(), "-n", "titan-mh-" + tag_ + "-sw", "link", "set", "p" + std::to_string(k), up ? "up" : "down"});
    require_exit(link, 0, 30);
  }

  // The processes left in host k's namespace (`ip netns pids`), as a list; empty when none.
  std::string processes(int k) const {
    Subprocess pids({ip_path(), "netns", "pids", name(k)});
    require_exit(pids, 0, 30);
    std::string out = pids.output();
    std::replace(out.begin(), out.end(), '\n', ' ');
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  }

  // Takes the hosts down (their processes killed) and checks that no namespace, link or process is left.
  void close() {
    closed_ = true;
    const auto status = stop();
    INFO(holder_.output());
    REQUIRE(status);
    CHECK(exit_code(*status) == 143);  // the trap's exit on SIGTERM, after the teardown
    Subprocess check({"/bin/bash", netns_script(), "check", tag_}, {{"TMPDIR", state_.path.string()}});
    require_exit(check, 0, 30);
    CHECK_THAT(check.output(), Contains("clean " + tag_));
  }

 private:
  std::optional<int> stop() {
    kill(holder_.pid(), SIGTERM);
    auto status = holder_.wait(30);
    if (!status) {  // a holder that cannot stop: take its namespaces down anyway
      Subprocess down({"/bin/bash", netns_script(), "down", tag_}, {{"TMPDIR", state_.path.string()}});
      down.wait(30);
    }
    return status;
  }

  TempDir state_;
  Subprocess holder_;
  std::string tag_;
  bool closed_ = false;
};

const auto& trainer = titan::test::debug_trainer;

const std::vector<std::string> kFsdp4 = {"--parallelism.data_parallel_shard_degree", "4"};
const std::vector<std::string> kSave = {
    "--checkpoint.enable",        "true", "--checkpoint.interval", "2", "--checkpoint.last_save_model_only", "false",
    "--checkpoint.keep_latest_k", "0"};
const std::map<std::string, std::optional<std::string>> kSingle = {{"RANK", std::nullopt},
                                                                   {"WORLD_SIZE", std::nullopt}};

// Resuming from `step_folder` (the trainer's own checkpoint format, model and optimizer and loader).
std::vector<std::string> resume_from(const fs::path& step_folder) {
  return {"--checkpoint.initial_load_path", step_folder.string(), "--checkpoint.initial_load_model_only", "false"};
}

// Host k's titan-run for a static job of 2 hosts x 2 ranks, rank 0 on host 0 at port 29500 (each host
// has its own port space: no clash with the machine's or another test's).
std::vector<std::string> static_node(const Hosts& hosts, int k, const std::vector<std::string>& job,
                                     const std::string& master = Hosts::address(0)) {
  return hosts.on(
      k, concat({titan::test::titan_run_path(), "--nnodes", "2", "--node-rank", std::to_string(k), "--nproc-per-node",
                 "2", "--master-addr", master, "--master-port", "29500", "--failure-grace-seconds", "1", "--"},
                job));
}

// Runs node(0) and node(1), the two hosts' launchers; both must exit 0. Returns host 0's output.
std::string run_nodes(const std::function<std::vector<std::string>(int)>& node,
                      const std::map<std::string, std::optional<std::string>>& env = {}) {
  Subprocess node0(node(0), env), node1(node(1), env);
  require_exit(node0, 0, 300);
  require_exit(node1, 0, 300);
  return node0.output();
}

// Runs `job` on 2 hosts x 2 ranks under titan-run, rank 0's host reached at `master`; both must exit 0.
// Returns host 0's output.
std::string run_two_hosts(const Hosts& hosts, const std::vector<std::string>& job,
                          const std::map<std::string, std::optional<std::string>>& env = {},
                          const std::string& master = Hosts::address(0)) {
  return run_nodes([&](int k) { return static_node(hosts, k, job, master); }, env);
}

// Steps first..last of `got` match `want` within 1e-5 relative: the same 8 sequences per step, reduced in
// another order over the network (fp32 differences of ~1e-7 carried through a few Adam steps).
void check_losses(const fs::path& want_dump, const fs::path& got_dump, int64_t first, int64_t last) {
  const auto want = titan::test::metrics_losses(want_dump), got = titan::test::metrics_losses(got_dump);
  for (int64_t step = first; step <= last; ++step) {
    INFO("step " << step);
    REQUIRE(want.count(step) == 1);
    REQUIRE(got.count(step) == 1);
    CHECK(got.at(step) == Approx(want.at(step)).epsilon(1e-5));
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Reads every node's output a little at a time (so that no pipe fills while another is read) until `done`
// holds; false when patience(`seconds`) pass first.
bool read_all_until(const std::vector<Subprocess*>& nodes, const std::function<bool()>& done, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    if (seconds_since(start) > titan::test::patience(seconds)) return false;
    for (Subprocess* node : nodes) node->read_until([](const std::string&) { return false; }, 0.05);
  }
  return true;
}

// True once `node` has exited (it is reaped then); never waits.
bool exited(Subprocess& node) { return node.wait(0).has_value(); }

// True when a line of `output` starts with `prefix` and contains `text`.
bool has_line(const std::string& output, const std::string& prefix, const std::string& text) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(prefix) && line.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("netns hosts: each has its own stack and reaches the others and nothing of them outlives the test",
          "[multihost][netns]") {
  Hosts hosts(2);
  // Host 1 reaches host 0 over tn0 from its own address (the route Gloo's default follows).
  Subprocess route(hosts.on(1, {ip_path(), "route", "get", Hosts::address(0)}));
  require_exit(route, 0, 30);
  CHECK_THAT(route.output(), Contains("dev tn0 src " + Hosts::address(1)));
  Subprocess route6(hosts.on(1, {ip_path(), "route", "get", "fd00:7e57::1"}));
  require_exit(route6, 0, 30);
  CHECK_THAT(route6.output(), Contains("dev tn0 proto kernel src fd00:7e57::2"));
  Subprocess loopback(hosts.on(0, {ip_path(), "-o", "link", "show", "lo"}));
  require_exit(loopback, 0, 30);
  CHECK_THAT(loopback.output(), Contains("UP"));
  hosts.close();

  // The holder also cleans up when the test dies without a word (its parent gone): here a shell that
  // starts it and is killed with SIGKILL.
  TempDir state;
  Subprocess parent({"/bin/bash", "-c", "bash \"$0\" hold 2 & wait", netns_script()},
                    {{"TMPDIR", state.path.string()}});
  REQUIRE(parent.read_until([](const std::string& out) { return out.find("ready ") != std::string::npos; }, 30));
  const std::size_t at = parent.output().find("ready ") + 6;
  const std::string tag = parent.output().substr(at, parent.output().find('\n', at) - at);
  kill(parent.pid(), SIGKILL);
  parent.wait(30);
  bool clean = false;
  std::string report;
  for (int i = 0; i < 100 && !clean; ++i) {  // the holder notices within 0.2 s, then tears down
    usleep(100000);
    Subprocess check({"/bin/bash", netns_script(), "check", tag}, {{"TMPDIR", state.path.string()}});
    check.wait(30);
    report = check.output();
    clean = report.find("clean " + tag) != std::string::npos;
  }
  INFO(report);
  CHECK(clean);
}

TEST_CASE("two hosts: FSDP 4 over 2 hosts x 2 ranks matches one process and its checkpoint resumes on one host",
          "[multihost][launch][train]") {
  TempDir single, two;
  Subprocess one(concat(trainer(single.path, 4, 8), kSave), kSingle);
  require_exit(one, 0, 300);
  Hosts hosts(2);
  // Both hosts write to one dump folder, as the hosts of a cluster share a file system.
  const std::string output = run_two_hosts(hosts, concat(concat(trainer(two.path, 4, 2), kFsdp4), kSave));
  CHECK_THAT(output, Contains("FSDP(dp_shard=4) to the model"));
  check_losses(single.path, two.path, 1, 4);

  // The 2 hosts' step-2 checkpoint resumes in one process on one host; steps 3-4 follow the single run.
  TempDir resumed;
  Subprocess back(concat(trainer(resumed.path, 4, 8), resume_from(two.path / "checkpoint" / "step-2")), kSingle);
  require_exit(back, 0, 300);
  CHECK_THAT(back.output(), Contains("Resuming at step 3"));
  check_losses(single.path, resumed.path, 3, 4);
  hosts.close();
}

TEST_CASE("two hosts: FSDP 4 over IPv6 matches one process", "[multihost][launch][train]") {
  TempDir single, two;
  Subprocess one(trainer(single.path, 2, 8), kSingle);
  require_exit(one, 0, 300);
  Hosts hosts(2);
  // Host 0 is fd00:7e57::1; Gloo picks each host's fd00:7e57:: address, the one that routes there.
  run_two_hosts(hosts, concat(trainer(two.path, 2, 2), kFsdp4), {}, "fd00:7e57::1");
  check_losses(single.path, two.path, 1, 2);
  hosts.close();
}

TEST_CASE("two hosts: one process's checkpoint resumes on 2 hosts x 2 ranks", "[multihost][launch][train][full]") {
  TempDir single, two;
  Subprocess one(concat(trainer(single.path, 4, 8), kSave), kSingle);
  require_exit(one, 0, 300);
  Hosts hosts(2);
  const std::string output = run_two_hosts(
      hosts, concat(concat(trainer(two.path, 4, 2), kFsdp4), resume_from(single.path / "checkpoint" / "step-2")));
  CHECK_THAT(output, Contains("Resuming at step 3"));
  check_losses(single.path, two.path, 3, 4);
  hosts.close();
}

TEST_CASE("two hosts: HSDP with one replica per host x FSDP 2 within it matches one process",
          "[multihost][launch][train][full]") {
  TempDir single, two;
  Subprocess one(trainer(single.path, 3, 8), kSingle);
  require_exit(one, 0, 300);
  Hosts hosts(2);
  // dp_replicate is the outer axis: ranks 0-1 (host 0) and 2-3 (host 1) shard, 0+2 and 1+3 replicate.
  const std::string output =
      run_two_hosts(hosts, concat(trainer(two.path, 3, 2), {"--parallelism.data_parallel_replicate_degree", "2",
                                                            "--parallelism.data_parallel_shard_degree", "2"}));
  CHECK_THAT(output, Contains("HSDP(dp_replicate=2, dp_shard=2) to the model"));
  check_losses(single.path, two.path, 1, 3);
  hosts.close();
}

TEST_CASE("two hosts: GLOO_SOCKET_IFNAME picks the interface and a wrong one is named with those that exist",
          "[multihost][launch]") {
  Hosts hosts(2);
  TempDir good, bad;
  // The right interface: the job trains.
  run_two_hosts(hosts, concat(trainer(good.path, 1, 2), kFsdp4), {{"GLOO_SOCKET_IFNAME", "tn0"}});
  CHECK(titan::test::metrics_losses(good.path).size() == 1);
  // A wrong one: every rank stops within a minute naming it and the interfaces of its host, before the
  // store, so each host stops on its own: host 1 started after host 0 has gone does not wait for its store.
  const auto start = std::chrono::steady_clock::now();
  Subprocess node0(static_node(hosts, 0, concat(trainer(bad.path, 1, 2), kFsdp4)), {{"GLOO_SOCKET_IFNAME", "eth7"}});
  require_exit(node0, 1, 60);
  Subprocess node1(static_node(hosts, 1, concat(trainer(bad.path, 1, 2), kFsdp4)), {{"GLOO_SOCKET_IFNAME", "eth7"}});
  require_exit(node1, 1, 60);
  CHECK(seconds_since(start) < 60);
  for (const Subprocess* node : {&node0, &node1}) {
    CHECK_THAT(node->output(), Contains("expected GLOO_SOCKET_IFNAME to name network interfaces of this host, got "
                                        "'eth7', which does not exist. Interfaces here: lo (127.0.0.1"));
    CHECK_THAT(node->output(), Contains("tn0 (198.18.0."));
  }
  hosts.close();
}

TEST_CASE("two hosts: an unreachable master address and a taken port and a loopback name are named within a minute",
          "[multihost][launch]") {
  Hosts hosts(2);
  TempDir dump;
  const std::vector<std::string> job =
      concat(concat(trainer(dump.path, 1, 2), kFsdp4), {"--comm.init_timeout_seconds", "5"});
  {
    // No host has 198.18.0.99: host 1's ranks give up after comm.init_timeout_seconds naming host and port.
    const auto start = std::chrono::steady_clock::now();
    Subprocess node1(hosts.on(
        1, concat({titan::test::titan_run_path(), "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                   "--master-addr", "198.18.0.99", "--master-port", "29500", "--failure-grace-seconds", "1", "--"},
                  job)));
    require_exit(node1, 1, 60);
    CHECK(seconds_since(start) < 60);
    CHECK_THAT(node1.output(), Contains("expected to reach the rendezvous store at 198.18.0.99:29500"));
  }
  {
    // Another program holds port 29500 on host 0: rank 0 cannot serve the store there and says which port.
    Subprocess squatter(hosts.on(0, {std::string(titan::test::python()), "-c",
                                     "import socket, time\n"
                                     "s = socket.socket()\n"
                                     "s.bind(('0.0.0.0', 29500))\n"
                                     "s.listen()\n"
                                     "print('listening', flush=True)\n"
                                     "time.sleep(600)\n"}));
    REQUIRE(squatter.read_until([](const std::string& out) { return out.find("listening") != std::string::npos; }, 30));
    const auto start = std::chrono::steady_clock::now();
    Subprocess node0(static_node(hosts, 0, job));
    require_exit(node0, 1, 60);
    CHECK(seconds_since(start) < 60);
    CHECK_THAT(node0.output(), Contains("expected to serve the rendezvous store at 198.18.0.1:29500"));
    CHECK_THAT(node0.output(), Contains("EADDRINUSE"));
    kill(squatter.pid(), SIGKILL);
    squatter.wait(30);
  }
  {
    // Host 0 names itself "localhost" (a cluster's hosts file often maps a host's own name to 127.0.1.1):
    // the store serves every interface, but Gloo would bind loopback there, so host 0's ranks refuse.
    const auto start = std::chrono::steady_clock::now();
    Subprocess node0(hosts.on(
        0, concat({titan::test::titan_run_path(), "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2",
                   "--master-addr", "localhost", "--master-port", "29501", "--failure-grace-seconds", "1", "--"},
                  job)));
    Subprocess node1(hosts.on(
        1, concat({titan::test::titan_run_path(), "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                   "--master-addr", Hosts::address(0), "--master-port", "29501", "--failure-grace-seconds", "1", "--"},
                  job)));
    require_exit(node0, 1, 60);
    require_exit(node1, 1, 60);
    CHECK(seconds_since(start) < 60);
    CHECK_THAT(node0.output(), Contains("expected MASTER_ADDR 'localhost' to lead to an address the other hosts of "
                                        "the job reach, got 127.0.0.1 (loopback) on this host"));
  }
  hosts.close();
}

TEST_CASE("two hosts: torchrun's c10d rendezvous runs the FSDP 4 job over 2 hosts x 2 ranks",
          "[multihost][torchrun][train][slow]") {
  const fs::path torchrun = fs::path(std::string(titan::test::python())).parent_path() / "torchrun";
  REQUIRE(fs::exists(torchrun));
  TempDir single, two;
  Subprocess one(trainer(single.path, 3, 8), kSingle);
  require_exit(one, 0, 300);
  Hosts hosts(2);
  auto node = [&](int k) {
    // The hosts share this machine's hostname, which resolves to none of their addresses: host 0 is told it
    // hosts the rendezvous (is_host), and each host which address its ranks are reached at (--local-addr).
    // On real hosts, whose names resolve to their own addresses, torchrun works both out.
    return hosts.on(
        k, concat({torchrun.string(), "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", Hosts::address(0) + ":29400", "--rdzv-id", "titan-multihost", "--rdzv-conf",
                   k == 0 ? "is_host=1" : "is_host=0", "--local-addr", Hosts::address(k), "--no-python", "--"},
                  concat(trainer(two.path, 3, 2), kFsdp4)));
  };
  run_nodes(node);
  check_losses(single.path, two.path, 1, 3);
  hosts.close();
}

TEST_CASE(
    "three hosts: elastic titan-run goes on without a lost host from the checkpoint and takes it back at the next "
    "restart",
    "[multihost][elastic][train][slow]") {
  // One rank per host (3 ranks on 2 cores), FSDP over every rank, global batch 6 of 1-sequence microbatches:
  // 2 per rank on 3 hosts, 3 per rank on 2. Checkpoints every 2 steps.
  auto job = [](const fs::path& dump) {
    return concat(
        trainer(dump, 8, 1),
        {"--training.global_batch_size", "6", "--parallelism.data_parallel_shard_degree", "-1",
         "--parallelism.fsdp_reshard_after_forward", "never", "--checkpoint.enable", "true", "--checkpoint.interval",
         "2", "--checkpoint.keep_latest_k", "0", "--checkpoint.last_save_model_only", "false"});
  };
  TempDir single, elastic;
  Subprocess one(concat(trainer(single.path, 8, 6), {"--training.global_batch_size", "6"}), kSingle);
  require_exit(one, 0, 300);

  Hosts hosts(3);
  auto agent = [&](int k) {
    return hosts.on(
        k, concat({titan::test::titan_run_path(), "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-endpoint",
                   Hosts::address(0) + ":29400", "--rdzv-conf", "join_timeout=60,last_call_timeout=1", "--max-restarts",
                   "1", "--failure-grace-seconds", "1", "--grace-seconds", "20", "--"},
                  job(elastic.path)));
  };
  Subprocess node0(agent(0));  // first: the agent that can bind 198.18.0.1 hosts the rendezvous
  REQUIRE(node0.read_until(
      [](const std::string& out) { return out.find("hosting the elastic rendezvous") != std::string::npos; }, 30));
  Subprocess node1(agent(1)), node2(agent(2));
  // Host 2 goes away after the step-2 checkpoint: every process in its namespace gets SIGKILL.
  const bool mid_run = read_all_until(
      {&node0, &node1, &node2},
      [&] { return node0.output().find("Saved checkpoint step 2") != std::string::npos || exited(node0); }, 120);
  INFO(node0.output());
  REQUIRE(mid_run);
  Subprocess pids({ip_path(), "netns", "pids", hosts.name(2)});
  require_exit(pids, 0, 30);
  std::istringstream in(pids.output());
  int killed = 0;
  for (pid_t pid = 0; in >> pid;) killed += kill(pid, SIGKILL) == 0 ? 1 : 0;
  CHECK(killed >= 2);  // the agent and its rank
  CHECK(node2.wait(30));

  // The job restarts on the 2 hosts left and resumes from the checkpoint; then host 2's agent comes back. It
  // waits in the rendezvous, which restarts the job with it (as torchrun's agent restarts its workers when
  // nodes wait and the job is below MAX): the ranks get SIGTERM, save at the end of their step and the
  // job starts again on 3 hosts from that checkpoint. A membership change is no failure: --max-restarts 1
  // is spent on the loss alone.
  const std::string restart1 = "restarting the job (restart 1) on 2 node(s), world size 2";
  const bool resumed = read_all_until(
      {&node0, &node1},
      [&] {
        const auto at = node0.output().find(restart1);
        return (at != std::string::npos && node0.output().find("Resuming at step 3", at) != std::string::npos) ||
               exited(node0);
      },
      120);
  REQUIRE(resumed);
  REQUIRE_FALSE(exited(node0));
  Subprocess back(agent(2));
  const bool finished = read_all_until(
      {&node0, &node1, &back}, [&] { return exited(node0) && exited(node1) && exited(back); }, 300);
  INFO(node1.output());
  INFO(back.output());
  REQUIRE(finished);
  CHECK(exit_code(*node0.wait(0)) == 0);
  CHECK(exit_code(*node1.wait(0)) == 0);
  CHECK(exit_code(*back.wait(0)) == 0);
  // Host 2 was node 1 or 2 of the first start, by the order the agents joined in.
  const std::string lost = restart1 + "; this node is node 0 (ranks 0-0) after node ";
  const auto at = node0.output().find(lost);
  REQUIRE(at != std::string::npos);
  const std::string which = node0.output().substr(at + lost.size(), 45);
  CHECK((which == "1 was lost (its titan-run stopped answering)\n" ||
         which == "2 was lost (its titan-run stopped answering)\n"));
  const std::string restart2 = "restarting the job (restart 2) on 3 node(s), world size 3";
  CHECK_THAT(node0.output(), Contains(restart2 + "; this node is node 0 (ranks 0-0) after 1 node(s) joined"));
  CHECK_THAT(back.output(), Contains(restart2 + "; this node is node 2 (ranks 2-2) after 1 node(s) joined"));
  // The 3 hosts resume from the newest checkpoint, the one the 2 wrote on their way out.
  const std::string& log = node0.output();
  const auto second = log.find(restart2);
  REQUIRE(second != std::string::npos);
  const std::regex saved(R"(Saved checkpoint step (\d+))");
  int64_t newest = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.begin() + static_cast<std::ptrdiff_t>(second), saved);
       it != std::sregex_iterator(); ++it) {
    newest = std::max<int64_t>(newest, std::stoll((*it)[1].str()));
  }
  CHECK(newest >= 3);
  CHECK(log.find("Resuming at step " + std::to_string(newest + 1) +
                     " (global batch 6 = local batch 1 x 2 accumulation steps x data-parallel degree 3)",
                 second) != std::string::npos);
  CHECK(log.find("Training completed at step 8", second) != std::string::npos);
  // restarts.jsonl holds both restarts with their world sizes.
  const std::string restarts = titan::test::read_file(elastic.path / "restarts.jsonl");
  std::vector<nlohmann::json> records;
  std::istringstream lines(restarts);
  for (std::string line; std::getline(lines, line);) records.push_back(nlohmann::json::parse(line));
  REQUIRE(records.size() == 2);
  CHECK(records[0].at("world_size") == 2);
  CHECK(records[0].at("resume_step") == 3);
  CHECK(records[1].at("world_size") == 3);
  CHECK(records[1].at("resume_step") == newest + 1);
  // Every step, on 3 hosts, on 2 and on 3 again, follows the one-process run.
  check_losses(single.path, elastic.path, 1, 8);
  hosts.close();
}

TEST_CASE("two hosts: a host cut off past comm.train_timeout_seconds is named with its ranks and every rank exits",
          "[multihost][launch][train][partition][full]") {
  constexpr int kTimeout = 5;  // comm.train_timeout_seconds
  Hosts hosts(2);
  TempDir dump;
  // FSDP 4 over 2 hosts x 2 ranks, more steps than it will ever reach.
  const std::vector<std::string> job =
      concat(concat(trainer(dump.path, 1000, 2), kFsdp4), {"--comm.train_timeout_seconds", std::to_string(kTimeout)});
  Subprocess node0(static_node(hosts, 0, job)), node1(static_node(hosts, 1, job));
  const std::regex step3(R"(\[rank 0\] .* step: +3/1000)");
  const bool training = read_all_until(
      {&node0, &node1}, [&] { return std::regex_search(node0.output(), step3) || exited(node0); }, 180);
  INFO(node0.output());
  INFO(node1.output());
  REQUIRE(training);
  REQUIRE_FALSE(exited(node0));

  // Host 1's cable is pulled and stays out past the timeout, until both launchers are done.
  hosts.set_link(1, false);
  const auto cut = std::chrono::steady_clock::now();
  double named = -1, unreachable = -1;  // seconds after the cut
  const bool ended = read_all_until(
      {&node0, &node1},
      [&] {
        if (named < 0 && node0.output().find("sent no heartbeat") != std::string::npos) named = seconds_since(cut);
        if (unreachable < 0 && node1.output().find("unreachable") != std::string::npos) {
          unreachable = seconds_since(cut);
        }
        return exited(node0) && exited(node1);
      },
      kTimeout + 60);
  const double seconds = seconds_since(cut);
  hosts.set_link(1, true);  // back: what is left of the job could now talk, and must be gone anyway
  REQUIRE(ended);
  WARN("host 1 cut off: named after " << named << " s, its ranks saw the store unreachable after " << unreachable
                                      << " s, both launchers exited after " << seconds << " s (timeout " << kTimeout
                                      << " s)");
  // Host 0's ranks name host 1's ranks, its address and the store it lost, within the timeout + 10 s.
  CHECK(named >= 0);
  CHECK(named <= kTimeout + titan::test::patience(10));
  for (const std::string rank : {"[rank 0] ", "[rank 1] "}) {
    INFO(rank);
    CHECK(has_line(node0.output(), rank, "ranks 2, 3 on "));
    CHECK(has_line(node0.output(), rank, " (198.18.0.2) sent no heartbeat for "));
    CHECK(has_line(node0.output(), rank,
                   "that host is cut off from the store at 198.18.0.1:29500, or its processes "
                   "are gone. comm.train_timeout_seconds is 5 s."));
  }
  CHECK(has_line(node0.output(), "titan-run: ranks 2, 3 on ", "(198.18.0.2) unreachable (no heartbeat for "));
  // Host 1's ranks cannot reach the store: they say so, within the timeout + 10 s, and give up.
  CHECK(unreachable >= 0);
  CHECK(unreachable <= kTimeout + titan::test::patience(10));
  for (const std::string rank : {"[rank 2] ", "[rank 3] "}) {
    INFO(rank);
    CHECK(has_line(node1.output(), rank, "store at 198.18.0.1:29500 unreachable: "));
  }
  // Both jobs fail, all within the timeout + 10 s, and nothing of them is left on either host.
  CHECK(exit_code(*node0.wait(0)) != 0);
  CHECK(exit_code(*node1.wait(0)) != 0);
  CHECK(seconds <= kTimeout + titan::test::patience(10));
  CHECK(hosts.processes(0).empty());
  CHECK(hosts.processes(1).empty());
  // Every rank dumped its flight recorder, host 0's with the reason that names host 1's ranks.
  for (int r = 0; r < 4; ++r) {
    const fs::path file = dump.path / "comm_traces" / ("rank_" + std::to_string(r) + ".json");
    INFO(file);
    REQUIRE(fs::exists(file));
    if (r < 2) CHECK_THAT(titan::dist::read_trace(file).reason, Catch::StartsWith("ranks 2, 3 on "));
  }
  hosts.close();
}

TEST_CASE("two hosts: an elastic agent cut off from the rendezvous stops its ranks and leaves while the job goes on",
          "[multihost][elastic][partition][full]") {
  Hosts hosts(2);
  // One probe rank per host that waits on the first start and exits 0 after a restart. Probes every
  // second, 3 unanswered: a node cut off is lost after about 3-4 s.
  auto agent = [&](int k) {
    return hosts.on(
        k, {titan::test::titan_run_path(), "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-endpoint",
            Hosts::address(0) + ":29400", "--rdzv-conf",
            "join_timeout=30,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3", "--max-restarts", "1",
            "--failure-grace-seconds", "1", "--", titan::test::env_probe_path(), "--wait-first"});
  };
  Subprocess node0(agent(0));
  REQUIRE(node0.read_until(
      [](const std::string& out) { return out.find("hosting the elastic rendezvous") != std::string::npos; }, 30));
  Subprocess node1(agent(1));
  const bool started = read_all_until(
      {&node0, &node1},
      [&] {
        return titan::test::probe_lines(node0.output()).size() == 1 &&
               titan::test::probe_lines(node1.output()).size() == 1;
      },
      60);
  INFO(node0.output());
  INFO(node1.output());
  REQUIRE(started);
  const pid_t probe1 = static_cast<pid_t>(titan::test::probe_lines(node1.output()).at(1).field("pid"));

  hosts.set_link(1, false);
  const auto cut = std::chrono::steady_clock::now();
  double left = -1;  // when host 1's agent exited
  const bool ended = read_all_until(
      {&node0, &node1},
      [&] {
        if (left < 0 && exited(node1)) left = seconds_since(cut);
        return exited(node0) && exited(node1);
      },
      60);
  hosts.set_link(1, true);
  REQUIRE(ended);
  WARN("host 1's agent left " << left << " s after the cut");
  // Host 1's agent noticed the silence, stopped its rank and exited non-zero, naming the rendezvous.
  CHECK(exit_code(*node1.wait(0)) == 1);
  CHECK(left <= titan::test::patience(15));
  CHECK_THAT(node1.output(), Contains("lost the elastic rendezvous host at 198.18.0.1:29400 (no answer for 3 s "
                                      "(keep_alive_interval 1 s x keep_alive_max_attempt 3): this node is cut off "
                                      "from it, or it is down); this node stops"));
  CHECK_FALSE(titan::test::process_running(probe1));
  CHECK(hosts.processes(1).empty());
  // The rendezvous host lost node 1 the same way and finished the job alone.
  CHECK(exit_code(*node0.wait(0)) == 0);
  CHECK_THAT(node0.output(), Contains("restarting the job (restart 1) on 1 node(s), world size 1; this node is node "
                                      "0 (ranks 0-0) after node 1 was lost (its titan-run stopped answering: no "
                                      "answer for 3 s"));
  CHECK(hosts.processes(0).empty());
  hosts.close();
}
