// SPDX-License-Identifier: BSD-3-Clause
// Replica fault tolerance as real processes, the parts its tests share whichever lighthouse the groups meet at
// (replica_ft_test.cpp: titan's, replica_torchft_test.cpp: TorchFT's): each replica group is its own titan-run job
// of 2 FSDP ranks of the debug model (CPU fp32, deterministic, tinyshakespeare).
#pragma once

#include <nlohmann/json.hpp>

#include <regex>
#include <utility>

#include "dist/launch_test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"

namespace titan::test::replica_ft {

namespace fs = std::filesystem;

constexpr int64_t kSteps = 12;

// The lighthouse on a free port; its address once it serves.
struct Lighthouse {
  Subprocess process{{(binary_dir() / "bin" / "titan-lighthouse").string(), "--port", "0"}};
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
inline std::vector<std::string> replica_job(const fs::path& dump, int64_t replica, const std::string& lighthouse,
                                            const std::vector<std::string>& launcher_flags,
                                            const std::vector<std::string>& trainer_flags = {}) {
  std::vector<std::string> args = {titan_run_path(), "--nproc-per-node", "2"};
  args.insert(args.end(), launcher_flags.begin(), launcher_flags.end());
  args.push_back("--");
  const std::vector<std::string> job = tiny_fsdp2_trainer(dump, kSteps);
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
inline std::map<int64_t, Record> records(const fs::path& dump) {
  std::map<int64_t, Record> out;
  std::istringstream in(read_file(dump / "metrics.jsonl"));
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
inline size_t compare_final_tensors(const fs::path& a_dump, const fs::path& b_dump, const std::string& group) {
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
inline const std::map<std::string, std::optional<std::string>> kTogether = {{"TITAN_TEST_FAULTS", "ft_wait=1:2"}};
inline const std::map<std::string, std::optional<std::string>> kKillAtStep6 = {
    {"TITAN_TEST_FAULTS", "ft_wait=1:2,kill=0:6"}};

// Replica group 0 live and group 1, which its fault SIGKILLs, restarted once by its titan-run with no checkpoint of
// its own (it saves only its last step), so it must be healed; both must exit 0. Returns both logs (live, restarted).
inline std::pair<std::string, std::string> live_and_restarted(const fs::path& dir, const std::string& lighthouse,
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

// Replica group 0 live and group 1 killed as step 6 starts and restarted from nothing, both against the lighthouse at
// `address` on the strict backend: the restarted group is healed by the live one and both end bit for bit equal.
inline void restarted_group_heals_bitwise(const std::string& address) {
  TempDir dir;
  std::string outputs;  // both groups' logs, for a failure below
  {
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

}  // namespace titan::test::replica_ft
