// SPDX-License-Identifier: BSD-3-Clause
// Replica fault tolerance as real processes: a lighthouse and two replica groups, each its own titan-run
// job of 2 FSDP ranks (HSDP 2 replicas x 2 shards, CPU fp32, deterministic, tinyshakespeare). One group's
// rank is SIGKILLed as step 6 starts: the other finishes without a restart, with the losses of a run of
// that group alone from the step-5 checkpoint; restarted, the killed group rejoins, receives the live
// group's state and both end with the same weights and optimizer state, bit for bit, on the strict backend. Under
// semi-synchronous DiLoCo, a group killed between outer steps rejoins at the next one with the outer state, and
// groups resumed mid-window from their checkpoints train on bitwise.
#include "dist/replica_ft_util.hpp"

using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;
using titan::test::replica_ft::compare_final_tensors;
using titan::test::replica_ft::kKillAtStep6;
using titan::test::replica_ft::kSteps;
using titan::test::replica_ft::kTogether;
using titan::test::replica_ft::Lighthouse;
using titan::test::replica_ft::live_and_restarted;
using titan::test::replica_ft::Record;
using titan::test::replica_ft::records;
using titan::test::replica_ft::replica_job;
namespace fs = std::filesystem;

namespace {

// Semi-synchronous DiLoCo with an outer step every 3 steps (after steps 3, 6, 9 and 12).
const std::vector<std::string> kDiloco = {"--fault_tolerance.semi_sync_method", "diloco",
                                          "--fault_tolerance.sync_steps", "3"};

}  // namespace

TEST_CASE("replica fault tolerance: a killed replica group is left out and the other trains on alone",
          "[dist][launch][train][fault_tolerance][replica][slow]") {
  TempDir dir;
  std::map<int64_t, Record> survivor;
  std::string outputs;  // both groups' logs, for a failure below
  {
    Lighthouse lighthouse;
    const std::string address = lighthouse.address();
    Subprocess live(replica_job(dir.path / "r0", 0, address, {}), kTogether);
    Subprocess killed(replica_job(dir.path / "r1", 1, address, {}), kKillAtStep6);
    const std::optional<int> killed_status = killed.wait(300);
    INFO(killed.output());
    REQUIRE(killed_status.has_value());
    CHECK(*killed_status != 0);
    require_exit(live, 0, 300);
    INFO(live.output());
    // Killed after it joined step 6's quorum: the live group's first try of step 6 fails and runs again.
    CHECK_THAT(live.output(), Catch::Matchers::Contains("Step 6 did not commit across the replica groups"));
    survivor = records(dir.path / "r0");
    outputs = live.output() + killed.output();
  }
  INFO(outputs);
  REQUIRE(survivor.size() == static_cast<size_t>(kSteps));
  for (int64_t step = 1; step <= 5; ++step) CHECK(survivor.at(step).live == 2);
  for (int64_t step = 6; step <= kSteps; ++step) CHECK(survivor.at(step).live == 1);

  // Replica group 0 alone from its step-5 checkpoint: the run the survivor must equal from step 6.
  const fs::path alone = dir.path / "alone";
  fs::create_directories(alone / "checkpoint");
  fs::copy(dir.path / "r0" / "checkpoint" / "step-5", alone / "checkpoint" / "step-5", fs::copy_options::recursive);
  {
    Lighthouse lighthouse;
    Subprocess run(replica_job(alone, 0, lighthouse.address(), {}));
    require_exit(run, 0, 300);
  }
  const std::map<int64_t, Record> reference = records(alone);
  REQUIRE(reference.size() == static_cast<size_t>(kSteps - 5));
  double worst = 0;
  for (int64_t step = 6; step <= kSteps; ++step) {
    const double a = survivor.at(step).loss;
    const double b = reference.at(step).loss;
    worst = std::max(worst, std::abs(a - b) / std::abs(b));
  }
  INFO("largest relative loss difference, steps 6-" << kSteps << ": " << worst);
  CHECK(worst <= 1e-5);
}

TEST_CASE("replica fault tolerance: a restarted replica group heals from the live one and both agree bitwise",
          "[dist][launch][train][fault_tolerance][replica][full]") {
  Lighthouse lighthouse;
  titan::test::replica_ft::restarted_group_heals_bitwise(lighthouse.address());
}

TEST_CASE("replica fault tolerance: DiLoCo groups killed between outer steps rejoin at the next with the outer state",
          "[dist][launch][train][fault_tolerance][replica][semi_sync][full]") {
  TempDir dir;
  std::string outputs;  // both groups' logs, for a failure below
  {
    Lighthouse lighthouse;
    const std::string address = lighthouse.address();
    // Outer steps after steps 3, 6, 9 and 12. Both groups meet in the first (4:2); group 0's after step 9 waits for
    // the restarted group 1 (10:2), whose own first outer step (after its step 3) waits for group 0 (4:2).
    // Group 1 killed as step 5 starts: between the outer steps after 3 and 6, so group 0 runs the one after 6 alone.
    // The last outer step (13:2) waits for both too: on a loaded machine group 0 reached it first and ran it alone.
    const auto [live, restarted] = live_and_restarted(
        dir.path, address, kDiloco, "ft_wait=4:2,ft_wait=10:2,ft_wait=13:2", "ft_wait=4:2,ft_wait=13:2,kill=0:5");
    outputs = live + restarted;
    INFO(outputs);
    // Restarted, it trains steps 1-3 alone and is healed in the outer step after group 0's step 9.
    CHECK_THAT(restarted, Catch::Matchers::Contains("Replica group 1 is at step 3, the quorum at step 9"));
    CHECK_THAT(restarted, Catch::Matchers::Contains("healed to step 9"));
  }
  INFO(outputs);
  const std::map<int64_t, Record> live = records(dir.path / "r0");
  REQUIRE(live.size() == static_cast<size_t>(kSteps));
  // Both end with the same global model and outer state (last_sync, momentum), bit for bit; the AdamW state is each
  // group's own (DiLoCo's inner optimizer is never averaged).
  CHECK(compare_final_tensors(dir.path / "r0", dir.path / "r1", "model.") > 0);
  CHECK(compare_final_tensors(dir.path / "r0", dir.path / "r1", "semi_sync.") > 0);
}

TEST_CASE("replica fault tolerance: DiLoCo groups resumed mid-window from their checkpoints train bitwise on",
          "[dist][launch][train][fault_tolerance][replica][semi_sync][slow]") {
  TempDir dir;
  const auto run_pair = [&](const fs::path& r0, const fs::path& r1) {
    Lighthouse lighthouse;
    const std::string address = lighthouse.address();
    // Both groups in every outer step: each quorum waits for 2.
    const std::string wait = "ft_wait=4:2,ft_wait=7:2,ft_wait=10:2,ft_wait=13:2";
    Subprocess a(replica_job(r0, 0, address, {}, kDiloco), {{"TITAN_TEST_FAULTS", wait}});
    Subprocess b(replica_job(r1, 1, address, {}, kDiloco), {{"TITAN_TEST_FAULTS", wait}});
    require_exit(a, 0, 300);
    require_exit(b, 0, 300);
  };
  run_pair(dir.path / "r0", dir.path / "r1");
  // Step 5's checkpoints hold the outer state of the step-3 outer step, two steps into the next window.
  for (const char* group : {"r0", "r1"}) {
    fs::create_directories(dir.path / "resumed" / group / "checkpoint");
    fs::copy(dir.path / group / "checkpoint" / "step-5", dir.path / "resumed" / group / "checkpoint" / "step-5",
             fs::copy_options::recursive);
  }
  run_pair(dir.path / "resumed" / "r0", dir.path / "resumed" / "r1");
  for (const char* group : {"r0", "r1"}) {
    const std::map<int64_t, Record> whole = records(dir.path / group);
    const std::map<int64_t, Record> resumed = records(dir.path / "resumed" / group);
    REQUIRE(resumed.size() == static_cast<size_t>(kSteps - 5));
    for (int64_t step = 6; step <= kSteps; ++step) {
      INFO(group << " step " << step);
      CHECK(resumed.at(step).loss == whole.at(step).loss);
    }
  }
  CHECK(compare_final_tensors(dir.path / "r0", dir.path / "resumed" / "r0", "semi_sync.") > 0);
}
