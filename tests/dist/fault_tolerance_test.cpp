// SPDX-License-Identifier: BSD-3-Clause
// Surviving failures with the bundled trainer as real processes under titan-run (2 FSDP ranks, CPU fp32,
// deterministic): SIGTERM makes every rank save the step it is on and exit 0, and the same command then
// resumes; with --max-restarts a SIGKILLed rank restarts the whole job from the newest checkpoint. Both
// end with losses bitwise equal to an uninterrupted run's.
#include <nlohmann/json.hpp>

#include <signal.h>

#include <regex>
#include <set>
#include <utility>

#include "dist/launch_test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"

using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;
namespace fs = std::filesystem;

namespace {

// Past the restart test's kill at step 7: its restart resumes at 5 and trains 4 steps on the restored state.
constexpr int64_t kSteps = 8;

// 2 FSDP ranks of the debug model on tinyshakespeare, `kSteps` steps of 2 x 2 sequences of 32 tokens.
std::vector<std::string> fsdp_run(const fs::path& dump, const std::vector<std::string>& launcher_flags,
                                  const std::vector<std::string>& trainer_flags) {
  std::vector<std::string> args = {titan::test::titan_run_path(), "--nproc-per-node", "2"};
  args.insert(args.end(), launcher_flags.begin(), launcher_flags.end());
  const std::vector<std::string> trainer = titan::test::tiny_fsdp2_trainer(dump, kSteps);
  args.push_back("--");
  args.insert(args.end(), trainer.begin(), trainer.end());
  args.insert(args.end(), trainer_flags.begin(), trainer_flags.end());
  return args;
}

std::vector<std::string> checkpoint_every(const std::string& interval) {
  return {
      "--checkpoint.enable", "true", "--checkpoint.interval", interval, "--checkpoint.last_save_model_only", "false"};
}

// (step, loss) of every metrics.jsonl record in file order: a resumed run appends its steps.
std::vector<std::pair<int64_t, double>> records(const fs::path& dump) {
  std::vector<std::pair<int64_t, double>> out;
  std::istringstream in(titan::test::read_file(dump / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss_metrics/global_avg_loss"))
      out.emplace_back(j.at("step").get<int64_t>(), j.at("loss_metrics/global_avg_loss").get<double>());
  }
  return out;
}

// The uninterrupted run's losses, steps 1..kSteps.
std::vector<double> reference_losses() {
  TempDir dump;
  Subprocess run(fsdp_run(dump.path, {}, {}));
  require_exit(run, 0, 300);
  std::vector<double> losses;
  for (const auto& [step, loss] : records(dump.path)) {
    CHECK(step == static_cast<int64_t>(losses.size()) + 1);
    losses.push_back(loss);
  }
  REQUIRE(losses.size() == static_cast<size_t>(kSteps));
  return losses;
}

// True once rank 0 has printed the metric line of step `step`.
auto printed_step(int64_t step) {
  return [step](const std::string& output) {
    const std::regex line_re("\\[rank 0\\] .*step:\\s+" + std::to_string(step) + "/");
    return std::regex_search(output, line_re);
  };
}

const std::map<std::string, std::optional<std::string>> kInfo = {{"TITAN_LOG_LEVEL", "info"}};

}  // namespace

TEST_CASE("preemption: SIGTERM saves the current step on every rank and exits 0 and the rerun resumes bitwise",
          "[dist][launch][train][fault_tolerance][full]") {
  const std::vector<double> want = reference_losses();
  TempDir dump;
  // The interval is never reached: the only mid-run checkpoint is the preemption's.
  Subprocess first(fsdp_run(dump.path, {}, checkpoint_every("1000")), kInfo);
  REQUIRE(first.read_until(printed_step(3), 120));
  REQUIRE(kill(first.pid(), SIGTERM) == 0);  // titan-run forwards it to both ranks
  require_exit(first, 0, 120);
  INFO(first.output());
  const std::smatch stopped = [&] {
    std::smatch m;
    static const std::regex stop_re(R"(Training stopped at step (\d+) on SIGTERM)");
    std::regex_search(first.output(), m, stop_re);
    return m;
  }();
  REQUIRE_FALSE(stopped.empty());
  const int64_t stop = std::stoll(stopped[1].str());
  CHECK(stop >= 3);
  REQUIRE(stop < kSteps);
  CHECK_THAT(first.output(), Catch::Contains("titan-run: received SIGTERM; every rank stopped and exited 0"));
  // Both ranks stopped after the same step: one complete checkpoint of it, with both ranks' files.
  const fs::path saved = dump.path / "checkpoint" / ("step-" + std::to_string(stop));
  CHECK_FALSE(titan::checkpoint::check_complete(saved));
  CHECK(nlohmann::json::parse(titan::test::read_file(saved / "index.json")).at("files").size() == 2);
  const auto before = records(dump.path);
  REQUIRE(before.size() == static_cast<size_t>(stop));
  CHECK(before.back().first == stop);

  Subprocess second(fsdp_run(dump.path, {}, checkpoint_every("1000")), kInfo);
  require_exit(second, 0, 300);
  CHECK_THAT(second.output(), Catch::Contains("Resuming at step " + std::to_string(stop + 1)));
  const auto all = records(dump.path);
  REQUIRE(all.size() == static_cast<size_t>(kSteps));  // no step lost, none repeated
  for (size_t i = 0; i < all.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(all[i].first == static_cast<int64_t>(i) + 1);
    CHECK(all[i].second == want[i]);  // deterministic CPU fp32: the same operations on the same bits
  }
}

TEST_CASE("restart: --max-restarts starts the job again after a SIGKILLed rank and the losses stay bitwise",
          "[dist][launch][train][fault_tolerance][full]") {
  const std::vector<double> want = reference_losses();
  TempDir dump;
  // Rank 1 dies as step 7 starts (first attempt only); the newest checkpoint is step 4.
  Subprocess run(fsdp_run(dump.path, {"--max-restarts", "2"}, checkpoint_every("4")),
                 {{"TITAN_LOG_LEVEL", "info"}, {"TITAN_TEST_FAULTS", "kill=1:7"}});
  require_exit(run, 0, 300);
  INFO(run.output());
  CHECK_THAT(run.output(),
             Catch::Contains("titan-run: rank 1 was killed by signal 9 (SIGKILL); stopped the other 1 rank"));
  CHECK_THAT(run.output(), Catch::Contains("titan-run: restarting the job (restart 1 of 2) after rank 1 was killed "
                                           "by signal 9 (SIGKILL)"));
  CHECK_THAT(run.output(), Catch::Contains("Resuming at step 5"));
  CHECK_THAT(run.output(), !Catch::Contains("restart 2 of 2"));  // the hook is off after the first attempt

  // Rank 0 of the restarted job recorded why and where it resumed.
  const std::string log = titan::test::read_file(dump.path / "restarts.jsonl");
  REQUIRE(std::count(log.begin(), log.end(), '\n') == 1);
  const auto restart = nlohmann::json::parse(log.substr(0, log.find('\n')));
  CHECK(restart.at("restart_count") == 1);
  CHECK(restart.at("reason") == "rank 1 was killed by signal 9 (SIGKILL)");
  CHECK(restart.at("resume_step") == 5);

  // metrics.jsonl: the first attempt's steps 1..k (k >= 6), then the restart's 5..8 with nothing
  // skipped or repeated; every loss equals the uninterrupted run's bitwise.
  const auto all = records(dump.path);
  size_t resumed_at = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].first <= all[i - 1].first) resumed_at = i;
  }
  REQUIRE(resumed_at >= 6);
  CHECK(all.size() - resumed_at == static_cast<size_t>(kSteps - 4));
  for (size_t i = 0; i < all.size(); ++i) {
    const int64_t expected_step =
        i < resumed_at ? static_cast<int64_t>(i) + 1 : static_cast<int64_t>(i - resumed_at) + 5;
    INFO("record " << i << " step " << all[i].first);
    CHECK(all[i].first == expected_step);
    CHECK(all[i].second == want[static_cast<size_t>(all[i].first - 1)]);
  }
}

TEST_CASE("titan-run: --max-restarts starts every rank again on a new port and returns the last failure",
          "[dist][titan-run][fault_tolerance]") {
  // Rank 1 fails on every attempt: one start and two restarts, then titan-run gives up with its status. It
  // fails only once rank 0 of its attempt printed its probe line: titan-run stops rank 0 when rank 1 exits.
  TempDir sync;
  Subprocess run({titan::test::titan_run_path(), "--nproc-per-node", "2", "--max-restarts", "2", "--",
                  titan::test::env_probe_path(), "--wait", "--fail-rank", "1", "--exit-code", "7", "--after-rank0",
                  sync.path.string()});
  require_exit(run, 7, 120);
  const std::string& out = run.output();
  CHECK_THAT(out, Catch::Contains("titan-run: restarting the job (restart 1 of 2) after rank 1 exited with status 7"));
  CHECK_THAT(out, Catch::Contains("titan-run: restarting the job (restart 2 of 2) after rank 1 exited with status 7"));
  CHECK_THAT(out, !Catch::Contains("restart 3"));
  // Each attempt's probes printed their line: 3 attempts x 2 ranks, each attempt on its own port.
  static const std::regex port_re(R"(\[rank 0\] probe .*master_port=(\d+))");
  std::set<std::string> ports;
  int attempts = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), port_re), end; it != end; ++it, ++attempts) {
    ports.insert((*it)[1].str());
  }
  CHECK(attempts == 3);
  CHECK(ports.size() >= 2);  // a fresh free port each time (the kernel may hand one out twice, rarely)
}
