// SPDX-License-Identifier: BSD-3-Clause
// examples/custom_loop, a loop of ~70 lines over titan's public training components, against the Trainer
// (build/bin/train), both as 2 processes under titan-run, CPU fp32, deterministic: Llama 3's debug model under FSDP
// 2, the loop stopped after its step-3 checkpoint and resumed, and Qwen3-MoE under EP 2 with its expert biases. The
// two programs make the same calls in the same order on the same data, so every logged loss, grad norm and expert
// load ratio is bitwise the Trainer's, and so is every tensor of the last checkpoint (weights, optimizer state,
// expert biases, RNG).
#include <nlohmann/json.hpp>

#include <map>
#include <sstream>

#include "dist/launch_test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"

namespace titan::test {
namespace {

struct Job {
  std::string model = "llama3";
  std::string flavor = "debugmodel";
  std::vector<std::string> degrees{};  // parallelism flags for the 2 ranks
};

// `program` on tinyshakespeare under titan-run with 2 ranks: `steps` steps of 4 sequences of 32 tokens, a full
// checkpoint every 3 steps and at the end.
std::vector<std::string> job_args(const std::string& program, const Job& job, const fs::path& dump, int64_t steps) {
  std::vector<std::string> args =
      concat({titan_run_path(), "--nproc-per-node", "2", "--"}, debug_job(program, dump, steps, /*local_batch=*/2));
  args.insert(args.end(), {"--model.name", job.model, "--model.flavor", job.flavor, "--optimizer.lr", "1e-2",
                           "--activation_checkpoint.mode", "none", "--checkpoint.enable", "true",
                           "--checkpoint.interval", "3", "--checkpoint.last_save_model_only", "false"});
  args.insert(args.end(), job.degrees.begin(), job.degrees.end());
  return args;
}

std::string run(const std::vector<std::string>& args) {
  Subprocess p(args, {{"TITAN_LOG_LEVEL", "info"}});
  require_exit(p, 0, 300);
  return p.output();
}

// step -> the metrics.jsonl record of that step (a resumed run appends; the latest line of a step wins).
std::map<int64_t, nlohmann::json> records(const fs::path& dump) {
  std::map<int64_t, nlohmann::json> out;
  std::istringstream in(read_file(dump / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("loss_metrics/global_avg_loss")) continue;
    const auto step = j.at("step").get<int64_t>();  // before the move: json's operator= takes its value first
    out[step] = std::move(j);
  }
  return out;
}

// Every tensor of every rank's part of a checkpoint folder, by file and key.
std::map<std::string, at::Tensor> checkpoint_tensors(const fs::path& folder) {
  std::map<std::string, at::Tensor> out;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.path().extension() != ".safetensors") continue;
    const checkpoint::SafetensorsFile file(entry.path());
    for (const auto& [key, _] : file.entries()) out[entry.path().filename().string() + ":" + key] = file.read(key);
  }
  return out;
}

// The Trainer for `steps` straight; the custom loop to `stop`, then resumed to `steps`: metrics and the last
// checkpoint equal bit for bit. Returns the Trainer's records.
std::map<int64_t, nlohmann::json> check_bitwise(const Job& job, int64_t steps, int64_t stop,
                                                const std::vector<std::string>& keys) {
  TempDir trainer, loop;
  const std::string trained = run(job_args("train", job, trainer.path, steps));
  run(job_args("custom_loop", job, loop.path, stop));
  const std::string resumed = run(job_args("custom_loop", job, loop.path, steps));
  CHECK_THAT(resumed, Catch::Contains(fmt::format("Resuming at step {}", stop + 1)));
  const auto want = records(trainer.path);
  const auto got = records(loop.path);
  REQUIRE(static_cast<int64_t>(want.size()) == steps);
  REQUIRE(static_cast<int64_t>(got.size()) == steps);
  for (int64_t step = 1; step <= steps; ++step) {
    for (const std::string& key : keys) {
      INFO("step " << step << " " << key << ": custom loop " << got.at(step).dump() << " vs Trainer "
                   << want.at(step).dump());
      REQUIRE(want.at(step).contains(key));
      CHECK(got.at(step).at(key).get<double>() == want.at(step).at(key).get<double>());
    }
  }
  const auto last = fmt::format("step-{}", steps);
  const auto a = checkpoint_tensors(trainer.path / "checkpoint" / last);
  const auto b = checkpoint_tensors(loop.path / "checkpoint" / last);
  REQUIRE(!a.empty());
  REQUIRE(a.size() == b.size());
  for (const auto& [key, tensor] : a) {
    INFO(key);
    REQUIRE(b.contains(key));
    CHECK(at::equal(b.at(key), tensor));
  }
  return want;
}

}  // namespace

TEST_CASE(
    "custom_loop vs Trainer: Llama 3 FSDP 2 with a resume gives every loss and grad norm and the checkpoint bitwise",
    "[train][example][custom_loop][dist][full]") {
  const auto records = check_bitwise({.degrees = {"--parallelism.data_parallel_shard_degree", "2"}}, /*steps=*/6,
                                     /*stop=*/3, {"loss_metrics/global_avg_loss", "grad_norm"});
  // Bitwise equal runs that did not train would also agree: the loss moved.
  CHECK(records.at(6).at("loss_metrics/global_avg_loss").get<double>() <
        records.at(1).at("loss_metrics/global_avg_loss").get<double>());
}

TEST_CASE("custom_loop vs Trainer: Qwen3-MoE EP 2 gives every loss and load ratio and the expert biases bitwise",
          "[train][example][custom_loop][moe][dist][full]") {
  const Job moe{
      .model = "qwen3",
      .flavor = "tiny_moe",
      .degrees = {"--parallelism.data_parallel_shard_degree", "2", "--parallelism.expert_parallel_degree", "2"}};
  const auto records =
      check_bitwise(moe, /*steps=*/4, /*stop=*/3, {"loss_metrics/global_avg_loss", "grad_norm", "moe/max_load_ratio"});
  // The balancing ran: a ratio above 1 is an uneven load the bias then moved against.
  CHECK(records.at(1).at("moe/max_load_ratio").get<double>() > 1.0);
}

}  // namespace titan::test
