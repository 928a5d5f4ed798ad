// SPDX-License-Identifier: BSD-3-Clause
// Replica fault tolerance against TorchFT's own lighthouse (the server of the pinned torchft wheel's
// `torchft_lighthouse`, started from the venv by tests/oracles/torchft_lighthouse.py): two titan replica groups, one
// killed and restarted, heal and end bit for bit equal as they do at titan's lighthouse (replica_ft_util.hpp runs
// both); the lighthouse's --min_replicas keeps a lone group from training, and its --join_timeout_ms is how long two
// groups wait for a straggler that heartbeats but never asks (TorchFT's own client plays it). Built with
// TITAN_WITH_GRPC only.
#include <set>

#include "dist/replica_ft_util.hpp"

namespace replica_torchft_test {

namespace fs = std::filesystem;
using titan::test::Subprocess;

// `command` with its output sent to `log`: a lighthouse logs every quorum, and a pipe nobody reads would fill and
// stall it. exec keeps the pid, so the Subprocess's SIGKILL (on every way out of a test) reaches the program.
std::vector<std::string> logged(const fs::path& log, const std::vector<std::string>& command) {
  std::vector<std::string> out = {"/bin/sh", "-c", "log=$1; shift; exec \"$@\" > \"$log\" 2>&1", "sh", log.string()};
  out.insert(out.end(), command.begin(), command.end());
  return out;
}

// TorchFT's lighthouse on a free port with `flags`.
struct TorchftLighthouse {
  TorchftLighthouse(const fs::path& dir, const std::vector<std::string>& flags)
      : log(dir / "lighthouse.log"), process(logged(log, command(flags))) {}

  static std::vector<std::string> command(const std::vector<std::string>& flags) {
    // torchft_lighthouse's own server less the torchft package's import of torch (the oracle says why).
    std::vector<std::string> out = {titan::test::python(),
                                    (titan::test::test_dir() / "oracles" / "torchft_lighthouse.py").string(), "--bind",
                                    "127.0.0.1:0"};
    out.insert(out.end(), flags.begin(), flags.end());
    return out;
  }

  std::string output() const { return fs::exists(log) ? titan::test::read_file(log) : std::string{}; }

  // As TORCHFT_LIGHTHOUSE takes it, once it serves.
  std::string address() const {
    const std::regex serving("listening on: http://[^:\\s]+:(\\d+)");
    std::smatch m;
    for (int tries = 0; tries < 600; ++tries) {
      const std::string out = output();
      if (std::regex_search(out, m, serving)) return "http://127.0.0.1:" + m[1].str();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL("torchft_lighthouse did not serve within 60 s: " << output());
    return "";
  }

  fs::path log;
  Subprocess process;
};

// A quorum fails after 9/10 of it, 5.4 s: the lone group's run is that wait, and a shorter wait is a shorter test.
const std::vector<std::string> kShortQuorum = {"--comm.train_timeout_seconds", "6"};

}  // namespace replica_torchft_test

using replica_torchft_test::kShortQuorum;
using replica_torchft_test::TorchftLighthouse;
using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;
using titan::test::replica_ft::replica_job;
namespace fs = std::filesystem;

TEST_CASE("replica fault tolerance over TorchFT's lighthouse: a restarted replica group heals and both agree bitwise",
          "[dist][launch][train][fault_tolerance][replica][torchft][full]") {
  TempDir dir;
  // A dead group's heartbeats stop counting after 2 s (TorchFT's default is 5 s); titan beats every 100 ms.
  TorchftLighthouse lighthouse(dir.path,
                               {"--min_replicas", "1", "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "2000"});
  titan::test::replica_ft::restarted_group_heals_bitwise(lighthouse.address());
  // The restarted group asked as a new member (a process of its own), so the lighthouse gave it a new quorum id.
  const std::string log = lighthouse.output();
  std::set<std::string> members;
  const std::regex asked("Received quorum request for replica (\\S+)");
  for (std::sregex_iterator it(log.begin(), log.end(), asked), end; it != end; ++it) members.insert((*it)[1].str());
  INFO(log);
  CHECK(members.size() == 3);  // group 0, group 1 and group 1 restarted
}

TEST_CASE("replica fault tolerance over TorchFT's lighthouse: a lone replica group gets no quorum below --min_replicas",
          "[dist][launch][fault_tolerance][replica][torchft]") {
  TempDir dir;
  TorchftLighthouse lighthouse(dir.path, {"--min_replicas", "2", "--join_timeout_ms", "100"});
  // titan's own rule would let it train alone (fault_tolerance.min_replica_size 1): the lighthouse's decides.
  Subprocess alone(replica_job(dir.path / "r0", 0, lighthouse.address(), {}, kShortQuorum));
  const std::optional<int> status = alone.wait(300);
  INFO(alone.output());
  REQUIRE(status.has_value());
  CHECK(*status != 0);
  CHECK_THAT(alone.output(), Catch::Matchers::Contains("expected a quorum from TorchFT's lighthouse"));
  CHECK_THAT(alone.output(), Catch::Matchers::Contains("--min_replicas"));
  // Not one step (the metrics file may exist, empty of losses).
  const fs::path metrics = dir.path / "r0" / "metrics.jsonl";
  CHECK((!fs::exists(metrics) || titan::test::replica_ft::records(dir.path / "r0").empty()));
}

TEST_CASE(
    "replica fault tolerance over TorchFT's lighthouse: groups wait --join_timeout_ms for a heartbeating straggler",
    "[dist][launch][train][fault_tolerance][replica][torchft][slow]") {
  // Slow tier: 40 s of two runs; the CI keeps the heal and min-replica runs at the same lighthouse.
  // Two groups ask; a third replica heartbeats and never asks. The lighthouse holds the quorum for it until its join
  // timeout: 10 minutes outlasts titan's 5.4 s quorum timeout, half a second does not.
  for (const char* join_timeout : {"600000", "500"}) {
    DYNAMIC_SECTION("--join_timeout_ms " << join_timeout) {
      TempDir dir;
      TorchftLighthouse lighthouse(dir.path, {"--min_replicas", "1", "--join_timeout_ms", join_timeout});
      const std::string address = lighthouse.address();
      Subprocess straggler({titan::test::python(),
                            (titan::test::test_dir() / "oracles" / "torchft_straggler.py").string(), address,
                            "2:straggler"});
      REQUIRE(straggler.read_until([](const std::string& out) { return out.find("heartbeating") != std::string::npos; },
                                   120));
      // Only the run that must fail has titan's quorum timeout short; the other trains with the default timeouts.
      const bool decides = std::string(join_timeout) == "500";
      const std::vector<std::string> flags = decides ? std::vector<std::string>{} : kShortQuorum;
      Subprocess a(replica_job(dir.path / "r0", 0, address, {}, flags));
      Subprocess b(replica_job(dir.path / "r1", 1, address, {}, flags));
      const std::optional<int> a_status = a.wait(300);
      const std::optional<int> b_status = b.wait(300);
      INFO(a.output() << b.output() << lighthouse.output());
      REQUIRE((a_status.has_value() && b_status.has_value()));
      if (decides) {
        CHECK(*a_status == 0);
        CHECK(*b_status == 0);
        CHECK(titan::test::replica_ft::records(dir.path / "r0").at(titan::test::replica_ft::kSteps).live == 2);
      } else {
        CHECK(*a_status != 0);
        CHECK(*b_status != 0);
        CHECK_THAT(a.output(), Catch::Matchers::Contains("expected a quorum from TorchFT's lighthouse"));
      }
    }
  }
}
