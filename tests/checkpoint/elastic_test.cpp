// SPDX-License-Identifier: BSD-3-Clause
// Elastic world size: a job restarted on fewer ranks keeps training.global_batch_size, so each rank
// accumulates more microbatches and every step sees the samples the original layout would have seen;
// the bundled trainer on 4 FSDP ranks to step 10 then 2 ranks to step 20 follows the 4-rank run.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>

#include "dist/launch_test_util.hpp"
#include "titan/core/error.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/train/data_setup.hpp"

#include "data/data_test_util.hpp"

using Catch::Matchers::Contains;
using titan::test::require_exit;
using titan::test::Subprocess;
using titan::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kLocalBatch = 2;

titan::JobConfig loader_job() {
  titan::JobConfig c;
  c.training.dataset = "tinyshakespeare";
  c.training.dataset_path = titan::test::tinyshakespeare().string();
  c.training.local_batch_size = kLocalBatch;
  c.training.global_batch_size = kGlobalBatch;
  c.training.seq_len = 16;
  return c;
}

// Every rank's microbatches of one step, rank-major then microbatch order: the step's global batch.
at::Tensor step_rows(std::vector<std::unique_ptr<titan::data::DataLoader>>& ranks, int64_t accumulation) {
  std::vector<at::Tensor> rows;
  for (auto& loader : ranks) {
    for (int64_t m = 0; m < accumulation; ++m) rows.push_back(loader->next().labels);
  }
  return at::cat(rows);  // (global batch, seq_len)
}

}  // namespace

TEST_CASE("elastic: the loader state of 4 ranks at step 10 gives 2 ranks the 4 ranks' samples for every step",
          "[checkpoint][elastic][data]") {
  const titan::JobConfig c = loader_job();
  const auto tok = titan::test::tiny_tokenizer();
  REQUIRE(titan::gradient_accumulation_steps(c, 4) == 1);
  REQUIRE(titan::gradient_accumulation_steps(c, 2) == 2);
  std::vector<std::unique_ptr<titan::data::DataLoader>> four, two;
  for (int64_t r = 0; r < 4; ++r) four.push_back(titan::build_dataloader(c, tok, r, 4));
  for (int64_t step = 1; step <= 10; ++step) step_rows(four, 1);
  // At a step boundary every rank holds the same state: that is what the checkpoint stores.
  const nlohmann::json state = four[0]->state();
  for (const auto& loader : four) CHECK(loader->state() == state);
  CHECK(state.at("global_batch_size") == kGlobalBatch);
  for (int64_t r = 0; r < 2; ++r) {
    two.push_back(titan::build_dataloader(c, tok, r, 2));
    two.back()->load_state(nlohmann::json::parse(state.dump()));
  }
  for (int64_t step = 11; step <= 20; ++step) {
    INFO("step " << step);
    const at::Tensor want = step_rows(four, 1), got = step_rows(two, 2);
    REQUIRE(want.size(0) == kGlobalBatch);
    CHECK(at::equal(got, want));  // the same windows in the same order, so the same token count per step
  }
  CHECK(two[0]->state() == four[0]->state());
}

TEST_CASE("elastic: a global batch that does not split on the new layout names the keys to set",
          "[checkpoint][elastic][data]") {
  titan::JobConfig c = loader_job();
  c.training.global_batch_size = 8;
  c.training.local_batch_size = 4;  // fits 2 ranks, not 3 or 4
  CHECK(titan::gradient_accumulation_steps(c, 2) == 1);
  try {
    titan::gradient_accumulation_steps(c, 4);
    FAIL("expected a ConfigError");
  } catch (const titan::ConfigError& e) {
    CHECK(e.key() == "training.global_batch_size");
    CHECK_THAT(std::string(e.what()),
               Contains("training.global_batch_size (8) to be a multiple of training.local_batch_size (4) x "
                        "data-parallel degree (4) = 16") &&
                   Contains("set training.local_batch_size to a divisor of 2 (= 8 / 4 ranks)") &&
                   Contains("set training.global_batch_size to 16, which changes it"));
  }
  try {
    titan::gradient_accumulation_steps(c, 3);
    FAIL("expected a ConfigError");
  } catch (const titan::ConfigError& e) {
    CHECK_THAT(std::string(e.what()),
               Contains("run on a data-parallel degree that divides 8") && Contains("to 12, which changes it"));
  }
}

namespace {

std::string trainer_path() { return (titan::test::binary_dir() / "bin" / "train_llama3").string(); }

// The debug model on tinyshakespeare, deterministic CPU fp32, FSDP over every rank, global batch 8 of
// 2-sequence microbatches: 1 microbatch per rank on 4 ranks, 2 on 2 ranks. Checkpoints at 10 and 20.
std::vector<std::string> elastic_job(int64_t nproc, const fs::path& dump) {
  return {titan::test::titan_run_path(), "--nproc-per-node", std::to_string(nproc), "--", trainer_path(),
          "--model.flavor", "debugmodel", "--model.hf_assets_path", titan::test::test_tokenizer().string(),
          "--training.dataset", "tinyshakespeare", "--training.dataset_path", titan::test::tinyshakespeare().string(),
          "--training.seq_len", "32", "--training.local_batch_size", std::to_string(kLocalBatch),
          "--training.global_batch_size", std::to_string(kGlobalBatch), "--training.steps", "20",
          "--training.num_threads", "1", "--parallelism.data_parallel_shard_degree", "-1",
          // Fewer collectives per step (no backward all-gathers, no recomputation): 4 ranks on 2 busy
          // cores spend most of a step waiting for each other.
          "--parallelism.fsdp_reshard_after_forward", "never", "--activation_checkpoint.mode", "none", "--debug.seed",
          "7", "--debug.deterministic", "true", "--lr_scheduler.warmup_steps", "2", "--checkpoint.enable", "true",
          "--checkpoint.interval", "10", "--checkpoint.keep_latest_k", "0", "--checkpoint.last_save_model_only",
          "false", "--job.dump_folder", dump.string(), "--metrics.log_freq", "1"};
}

const std::map<std::string, std::optional<std::string>> kEnv = {
    {"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"TITAN_LOG_LEVEL", "info"}};

}  // namespace

TEST_CASE("elastic: 4 ranks to step 10 then a restart on 2 ranks to step 20 follow the 4-rank run",
          "[checkpoint][elastic][launch][train][full]") {
  // The uninterrupted 4-rank run; its step-10 checkpoint is what a 4-rank run stopped at step 10 leaves
  // (deterministic: the first 10 steps of both are the same operations on the same bits).
  TempDir straight, restarted;
  Subprocess four(elastic_job(4, straight.path), kEnv);
  require_exit(four, 0, 120);
  CHECK_THAT(four.output(), Contains("gradient accumulation steps 1"));
  const auto want = titan::test::metrics_losses(straight.path);
  REQUIRE(want.size() == 20);

  // The restart: the same command on 2 ranks, in a run folder whose newest checkpoint is step 10.
  fs::create_directories(restarted.path / "checkpoint");
  fs::copy(straight.path / "checkpoint" / "step-10", restarted.path / "checkpoint" / "step-10",
           fs::copy_options::recursive);
  Subprocess two(elastic_job(2, restarted.path), kEnv);
  require_exit(two, 0, 120);
  CHECK_THAT(two.output(),
             Contains("Resuming at step 11 (global batch 8 = local batch 2 x 2 accumulation steps x data-parallel "
                      "degree 2)"));
  CHECK_THAT(two.output(), !Contains("not the checkpoint's sequence"));
  const auto got = titan::test::metrics_losses(restarted.path);
  REQUIRE(got.size() == 10);
  for (int64_t step = 11; step <= 20; ++step) {
    INFO("step " << step);
    // The same 8 sequences per step from the same weights and Adam moments; 2 ranks sum 2 microbatches
    // each where 4 ranks summed 1, and FSDP reduces over 2 shards instead of 4: fp32 summation order,
    // ~1e-7 relative per step carried through 10 Adam steps. 1e-5 relative bounds it and fails on a
    // wrong window, a lost or repeated batch or a wrong loss scale (the accumulation splits it in two).
    CHECK(got.at(step) == Approx(want.at(step)).epsilon(1e-5));
  }
  // The loader ends where the 4-rank run's did: the same global stream, nothing skipped or repeated.
  const auto loader_at = [](const fs::path& dump) {
    return nlohmann::json::parse(titan::test::read_file(dump / "checkpoint" / "step-20" / "index.json"))
        .at("values")
        .at("dataloader");
  };
  CHECK(loader_at(restarted.path) == loader_at(straight.path));
}
