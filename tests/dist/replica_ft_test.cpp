// SPDX-License-Identifier: BSD-3-Clause
// Replica fault tolerance as real processes: a lighthouse and two replica groups, each its own titan-run
// job of 2 FSDP ranks (HSDP 2 replicas x 2 shards, CPU fp32, deterministic, tinyshakespeare). One group's
// rank is SIGKILLed as step 6 starts: the other finishes without a restart, with the losses of a run of
// that group alone from the step-5 checkpoint; restarted, the killed group rejoins, receives the live
// group's state and both end with the same weights and optimizer state, bit for bit, on the strict backend. Under
// semi-synchronous DiLoCo, a group killed between outer steps rejoins at the next one with the outer state, and
// groups resumed mid-window from their checkpoints train on bitwise.
#include <nlohmann/json.hpp>

#include <regex>
#include <utility>

#include "dist/launch_test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"

using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSteps = 12;

// The lighthouse on a free port; its address once it serves.
struct Lighthouse {
  Subprocess process{{(titan::test::binary_dir() / "bin" / "titan-lighthouse").string(), "--port", "0"}};
  std::string address() {
    REQUIRE(process.read_until([](const std::string& out) { return out.find("serving on port") != std::string::npos; },
                               60));
    std::smatch m;
    const std::string& out = process.output();
    REQUIRE(std::regex_search(out, m, std::regex("serving on port (\\d+)")));
    return "127.0.0.1:" + m[1].str();
  }
};

// Replica group `replica` of 2: 2 FSDP ranks of the debug model, checkpoints every 5 steps (the last one whole).
std::vector<std::string> replica_job(const fs::path& dump, int64_t replica, const std::string& lighthouse,
                                     const std::vector<std::string>& launcher_flags,
                                     const std::vector<std::string>& trainer_flags = {}) {
  std::vector<std::string> args = {titan::test::titan_run_path(), "--nproc-per-node", "2"};
  args.insert(args.end(), launcher_flags.begin(), launcher_flags.end());
  args.push_back("--");
  const std::vector<std::string> job = titan::test::tiny_fsdp2_trainer(dump, kSteps);
  args.insert(args.end(), job.begin(), job.end());
  const std::vector<std::string> trainer = {"--checkpoint.enable",
                                            "true",
                                            "--checkpoint.interval",
                                            "5",
                                            "--checkpoint.last_save_model_only",
                                            "false",
                                            "--fault_tolerance.enable",
                                            "true",
                                            "--fault_tolerance.replica_id",
                                            std::to_string(replica),
                                            "--fault_tolerance.group_size",
                                            "2",
                                            "--fault_tolerance.lighthouse",
                                            lighthouse,
                                            "--fault_tolerance.join_timeout_ms",
                                            "1000",
                                            "--fault_tolerance.process_group_timeout_ms",
                                            "5000"};
  args.insert(args.end(), trainer.begin(), trainer.end());
  args.insert(args.end(), trainer_flags.begin(), trainer_flags.end());
  return args;
}

struct Record {
  double loss = 0;
  double live = 0;  // ft/live_replicas
};

// Step -> record of every metrics.jsonl line with a loss; a step logged twice fails the test.
std::map<int64_t, Record> records(const fs::path& dump) {
  std::map<int64_t, Record> out;
  std::istringstream in(titan::test::read_file(dump / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss_metrics/global_avg_loss")) continue;
    const int64_t step = j.at("step").get<int64_t>();
    CHECK(out.count(step) == 0);
    out[step] = {.loss = j.at("loss_metrics/global_avg_loss").get<double>(), .live = j.value("ft/live_replicas", 0.0)};
  }
  return out;
}

// Every tensor whose key starts with `group` ("model.", "semi_sync.", "" for all) in both runs' final checkpoints,
// rank by rank: the same keys, equal bit for bit. Returns how many it compared.
size_t compare_final_tensors(const fs::path& a_dump, const fs::path& b_dump, const std::string& group) {
  size_t compared = 0;
  for (const char* rank_file : {"rank-00000.safetensors", "rank-00001.safetensors"}) {
    const std::string last = "step-" + std::to_string(kSteps);
    const titan::checkpoint::SafetensorsFile a(a_dump / "checkpoint" / last / rank_file);
    const titan::checkpoint::SafetensorsFile b(b_dump / "checkpoint" / last / rank_file);
    const auto in_group = [&](const titan::checkpoint::SafetensorsFile& file) {
      return std::count_if(file.entries().begin(), file.entries().end(),
                           [&](const auto& entry) { return entry.first.starts_with(group); });
    };
    CHECK(in_group(a) == in_group(b));
    for (const auto& [name, entry] : a.entries()) {
      if (!name.starts_with(group)) continue;
      INFO(rank_file << " " << name);
      REQUIRE(b.contains(name));
      CHECK(at::equal(a.read(name), b.read(name)));
      ++compared;
    }
  }
  return compared;
}

// Both groups start step 1 together, however long one takes to start (a busy machine).
const std::map<std::string, std::optional<std::string>> kTogether = {{"TITAN_TEST_FAULTS", "ft_wait=1:2"}};
const std::map<std::string, std::optional<std::string>> kKillAtStep6 = {{"TITAN_TEST_FAULTS", "ft_wait=1:2,kill=0:6"}};

// Replica group 0 live and group 1, which its fault SIGKILLs, restarted once by its titan-run with no checkpoint of
// its own (it saves only its last step), so it must be healed; both must exit 0. Returns both logs (live, restarted).
std::pair<std::string, std::string> live_and_restarted(const fs::path& dir, const std::string& lighthouse,
                                                       const std::vector<std::string>& flags,
                                                       const std::string& live_faults,
                                                       const std::string& restarted_faults) {
  Subprocess live(replica_job(dir / "r0", 0, lighthouse, {}, flags), {{"TITAN_TEST_FAULTS", live_faults}});
  std::vector<std::string> restarted_flags = flags;
  restarted_flags.insert(restarted_flags.end(), {"--checkpoint.interval", "100"});
  Subprocess restarted(replica_job(dir / "r1", 1, lighthouse, {"--max-restarts", "1"}, restarted_flags),
                       {{"TITAN_TEST_FAULTS", restarted_faults}});
  require_exit(restarted, 0, 300);
  require_exit(live, 0, 300);
  return {live.output(), restarted.output()};
}

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
  TempDir dir;
  std::string outputs;  // both groups' logs, for a failure below
  {
    Lighthouse lighthouse;
    const std::string address = lighthouse.address();
    // The live group's quorum for step 10 waits for both: the restarted group rejoins by then for sure.
    // Both groups on the strict backend: the quorum broadcast, the commit vote and the healing sends are held
    // to NCCL's rules (tensors on the group's device, the same collectives on every rank, sends met in order).
    const std::vector<std::string> strict = {"--comm.backend", "strict", "--fault_tolerance.process_group", "strict"};
    const auto [live, restarted] =
        live_and_restarted(dir.path, address, strict, "ft_wait=1:2,ft_wait=10:2", "ft_wait=1:2,kill=0:6");
    outputs = live + restarted;
    INFO(restarted);
    CHECK_THAT(restarted, Catch::Matchers::Contains("receiving the training state from replica group 0"));
    CHECK_THAT(restarted, Catch::Matchers::Contains("Replica group 1 is at step 0"));
    CHECK_THAT(restarted, Catch::Matchers::Contains("healed to step"));
    CHECK_THAT(live, Catch::Matchers::Contains("strict backend"));
  }
  INFO(outputs);
  const std::map<int64_t, Record> live = records(dir.path / "r0");
  REQUIRE(live.size() == static_cast<size_t>(kSteps));
  CHECK(live.at(kSteps).live == 2);
  // Every tensor of the final checkpoints (weights, Adam moments and steps, RNG) equal, rank by rank.
  CHECK(compare_final_tensors(dir.path / "r0", dir.path / "r1", "") > 0);
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
