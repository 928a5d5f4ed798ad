// SPDX-License-Identifier: BSD-3-Clause
// Checkpoints through the bundled trainer as real processes: exact resume (bitwise losses), resharding
// onto other layouts (FSDP 4 -> FSDP 2 and one process; FSDP 2 x TP 2 -> TP 2 and one process; PP 2 x FSDP 2 ->
// one process and PP 4) with
// the data stream continuing where it stopped, and a rank killed during an async save leaving the
// previous checkpoint loadable.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <signal.h>

#include <fstream>
#include <map>

#include "dist/launch_test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"

using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;
namespace fs = std::filesystem;

namespace {

using titan::test::concat;
const auto& trainer_args = titan::test::debug_trainer;

std::vector<std::string> titan_run(int64_t nproc, const std::vector<std::string>& args) {
  return concat({titan::test::titan_run_path(), "--nproc-per-node", std::to_string(nproc), "--"}, args);
}

const std::map<std::string, std::optional<std::string>> kSingle = {
    {"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"TITAN_LOG_LEVEL", "info"}};

}  // namespace

TEST_CASE("exact resume: 20 steps equal 10 then a new process resuming for 10 bitwise",
          "[checkpoint][resume][train][full]") {
  // 10 steps on each side of the save: past the warm-up (2 steps), with the lr decaying over all 20, every later
  // step depending on the restored weights, Adam moments, schedule and data position.
  TempDir straight, resumed;
  Subprocess a(trainer_args(straight.path, 20, 4), kSingle);
  require_exit(a, 0, 600);
  const std::vector<std::string> ckpt = {
      "--checkpoint.enable",        "true", "--checkpoint.interval", "10", "--checkpoint.last_save_model_only", "false",
      "--lr_scheduler.total_steps", "20"};
  Subprocess first(concat(trainer_args(resumed.path, 10, 4), ckpt), kSingle);
  require_exit(first, 0, 600);
  REQUIRE_FALSE(titan::checkpoint::check_complete(resumed.path / "checkpoint" / "step-10"));
  Subprocess second(concat(trainer_args(resumed.path, 20, 4), ckpt), kSingle);
  require_exit(second, 0, 600);
  CHECK_THAT(second.output(), Catch::Contains("Resuming at step 11"));
  const auto want = titan::test::metrics_losses(straight.path), got = titan::test::metrics_losses(resumed.path);
  REQUIRE(want.size() == 20);
  REQUIRE(got.size() == 20);
  for (int64_t step = 1; step <= 20; ++step) {
    INFO("step " << step);
    CHECK(got.at(step) == want.at(step));  // deterministic CPU fp32: the same operations on the same bits
  }
}

namespace {

// One layout: processes, local batch (global batch 8 everywhere) and its parallelism flags.
struct Layout {
  std::string name;
  int64_t nproc = 1;
  int64_t local_batch = 8;
  std::vector<std::string> flags{};
};

// Trains 8 steps on `from`, saving at step 4 and 8; then each layout in `to` resumes from the step-4
// checkpoint: its steps 5-8 must match the original's losses, and its loader must end where the
// original's did.
void check_reshard(const Layout& from, const std::vector<Layout>& to) {
  const std::vector<std::string> save = {
      "--checkpoint.enable",        "true", "--checkpoint.interval", "4", "--checkpoint.last_save_model_only", "false",
      "--checkpoint.keep_latest_k", "0"};
  auto run = [&](const Layout& layout, const fs::path& dump, const std::vector<std::string>& extra) {
    auto args = concat(concat(concat(trainer_args(dump, 8, layout.local_batch), save), layout.flags), extra);
    Subprocess p(layout.nproc > 1 ? titan_run(layout.nproc, args) : args, kSingle);
    require_exit(p, 0, 600);
    return p.output();
  };
  TempDir original;
  run(from, original.path, {});
  const fs::path step4 = original.path / "checkpoint" / "step-4";
  REQUIRE_FALSE(titan::checkpoint::check_complete(step4));
  CHECK(titan::test::checkpoint_index(step4).at("files").size() == static_cast<size_t>(from.nproc));
  const auto want = titan::test::metrics_losses(original.path);
  const nlohmann::json stream =
      titan::test::checkpoint_index(original.path / "checkpoint" / "step-8").at("values").at("dataloader");
  for (const Layout& layout : to) {
    INFO(from.name << " -> " << layout.name);
    TempDir dump;
    const std::string output =
        run(layout, dump.path,
            {"--checkpoint.initial_load_path", step4.string(), "--checkpoint.initial_load_model_only", "false"});
    CHECK_THAT(output, Catch::Contains("Resuming at step 5"));
    const auto got = titan::test::metrics_losses(dump.path);
    REQUIRE(got.size() == 4);
    for (int64_t step = 5; step <= 8; ++step) {
      INFO("step " << step);
      // The same 8 sequences per step from the same weights and moments, reduced in another order
      // (other shard sums, TP partial sums): fp32 differences of ~1e-7 relative carried through 4
      // Adam steps; 1e-5 relative bounds them and still fails on any wrong weight or window.
      CHECK(got.at(step) == Approx(want.at(step)).epsilon(1e-5));
    }
    // The loader ends where the original's did: no window repeated or skipped on the way.
    CHECK(titan::test::checkpoint_index(dump.path / "checkpoint" / "step-8").at("values").at("dataloader") == stream);
  }
}

const Layout kSingleLayout{.name = "one process", .nproc = 1, .local_batch = 8, .flags = {}};

}  // namespace

TEST_CASE("an FSDP 4 checkpoint resumes on FSDP 2 and on one process", "[checkpoint][reshard][launch][train][slow]") {
  check_reshard(
      {.name = "FSDP 4", .nproc = 4, .local_batch = 2, .flags = {"--parallelism.data_parallel_shard_degree", "4"}},
      {{.name = "FSDP 2", .nproc = 2, .local_batch = 4, .flags = {"--parallelism.data_parallel_shard_degree", "2"}},
       kSingleLayout});
}

TEST_CASE("an FSDP 2 x TP 2 checkpoint resumes on TP 2 and on one process",
          "[checkpoint][reshard][tp][launch][train][slow]") {
  check_reshard(
      {.name = "FSDP 2 x TP 2",
       .nproc = 4,
       .local_batch = 4,
       .flags = {"--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree", "2"}},
      {{.name = "TP 2",
        .nproc = 2,
        .local_batch = 8,
        .flags = {"--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree", "2"}},
       kSingleLayout});
}

TEST_CASE("a CP 2 x FSDP 2 checkpoint (sharded over dp_shard_cp) resumes on one process and on CP 2",
          "[checkpoint][reshard][cp][launch][train][slow]") {
  check_reshard(
      {.name = "CP 2 x FSDP 2",
       .nproc = 4,
       .local_batch = 4,
       .flags = {"--parallelism.context_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "2"}},
      {kSingleLayout,
       {.name = "CP 2",
        .nproc = 2,
        .local_batch = 8,
        .flags = {"--parallelism.context_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "1",
                  "--parallelism.context_parallel_rotate_method", "alltoall"}}});
}

TEST_CASE("a PP 2 x FSDP 2 checkpoint resumes on one process and on PP 4",
          "[checkpoint][reshard][pipeline][launch][train][full]") {
  check_reshard(
      {.name = "PP 2 x FSDP 2",
       .nproc = 4,
       .local_batch = 4,
       .flags = {"--parallelism.pipeline_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "2"}},
      {kSingleLayout,
       {.name = "PP 4",
        .nproc = 4,
        .local_batch = 8,
        .flags = {"--parallelism.pipeline_parallel_degree", "4", "--parallelism.data_parallel_shard_degree", "1"}}});
}

namespace {

// The pid of the child of `parent` whose environment holds `entry` (e.g. "RANK=1"), or -1.
pid_t child_with_env(pid_t parent, const std::string& entry) {
  DIR* proc = opendir("/proc");
  pid_t found = -1;
  while (dirent* e = proc ? readdir(proc) : nullptr) {
    const pid_t pid = static_cast<pid_t>(std::atol(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(line.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    const std::string env = titan::test::read_file(fmt::format("/proc/{}/environ", pid));
    if (env.find(std::string(1, '\0') + entry + std::string(1, '\0')) != std::string::npos) found = pid;
  }
  if (proc) closedir(proc);
  return found;
}

}  // namespace

TEST_CASE("a rank killed during an async save leaves the previous checkpoint loadable",
          "[checkpoint][fault][launch][train][full]") {
  TempDir dump;
  const fs::path root = dump.path / "checkpoint";
  const std::vector<std::string> save = {"--checkpoint.enable",
                                         "true",
                                         "--checkpoint.interval",
                                         "2",
                                         "--checkpoint.async_mode",
                                         "async",
                                         "--checkpoint.last_save_model_only",
                                         "false",
                                         "--parallelism.data_parallel_shard_degree",
                                         "2"};
  // Each rank pauses 1.5 s before writing its part: a window in which to kill rank 1 mid-save.
  Subprocess run(titan_run(2, concat(trainer_args(dump.path, 8, 4), save)),
                 {{"TITAN_TEST_FAULTS", "checkpoint_write_delay_ms=1500"}, {"TITAN_LOG_LEVEL", "info"}});
  // Short reads keep draining the ranks' output while watching the folder appear.
  const auto deadline = std::chrono::steady_clock::now() + titan::test::patience(std::chrono::seconds(300));
  while (!fs::exists(root / ".step-4.tmp") && std::chrono::steady_clock::now() < deadline) {
    run.read_until([](const std::string&) { return false; }, 0.02);
  }
  REQUIRE(fs::exists(root / ".step-4.tmp"));
  const pid_t rank1 = child_with_env(run.pid(), "RANK=1");
  REQUIRE(rank1 > 0);
  kill(rank1, SIGKILL);
  const auto status = run.wait(300);
  REQUIRE(status);
  CHECK(titan::test::exit_code(*status) != 0);
  INFO(run.output());
  REQUIRE_FALSE(titan::checkpoint::check_complete(root / "step-2"));
  CHECK_FALSE(fs::exists(root / "step-4"));

  // A new run (one process) skips the broken save and resumes from step 2.
  Subprocess resume(concat(trainer_args(dump.path, 3, 8), {"--checkpoint.enable", "true"}), kSingle);
  require_exit(resume, 0, 600);
  CHECK_THAT(resume.output(), Catch::Contains("(step 2)") && Catch::Contains("Resuming at step 3"));
}
