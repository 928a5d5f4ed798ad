// SPDX-License-Identifier: BSD-3-Clause
// LoRA through the Trainer (model.converters lora): the optimizer holds the adapters and nothing else, the frozen
// base weights never get a gradient and end bitwise as they started, the run counts its trainable parameters; with
// lora.save_adapter_only its checkpoints hold the adapters (a group "lora", no base), and a resume takes the base
// from checkpoint.initial_load_path and the adapters from the checkpoint, repeating the straight run's steps bitwise.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/lora.hpp"
#include "titan/optim/optimizer.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace lora_trainer_test {

using namespace titan;
namespace fs = std::filesystem;

JobConfig lora_job(const fs::path& dump, int64_t steps) {
  JobConfig c = test::tinyshakespeare_job(dump, /*seq_len=*/32, /*local_batch=*/2, steps, /*seed=*/5);
  c.model.converters = {"lora"};
  c.lora = {.rank = 4, .alpha = 8, .target_modules = {"attention.wq", "attention.wv", "feed_forward.w2"}};
  c.optimizer.lr = 1e-2;
  c.lr_scheduler.warmup_steps = 1;
  c.activation_checkpoint.mode = AcMode::none;
  c.metrics.disable_color_printing = true;
  return c;
}

std::map<std::string, std::string> index_keys(const fs::path& step) {
  std::ifstream in(step / "index.json");
  const auto index = nlohmann::json::parse(in);
  std::map<std::string, std::string> keys;
  for (const auto& [key, _] : index.at("tensors").items()) keys[key] = checkpoint::group_of(key);
  return keys;
}

TEST_CASE("a LoRA run trains its adapters only and leaves the base weights as they were", "[train][lora][full]") {
  test::TempDir dir;
  Trainer<llama3::Llama3> trainer(lora_job(dir.path, 3));
  const RankModel<llama3::Llama3>& model = trainer.rank_model();
  std::vector<at::Tensor> start;
  for (const at::Tensor& p : model.frozen_parameters()) start.push_back(p.detach().clone());
  REQUIRE(!start.empty());
  trainer.train();

  const Optimizer& optimizer = trainer.core().optimizer();
  REQUIRE(optimizer.params().size() == model.parameters().size());
  int64_t adapters = 0;
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    INFO(model.parameter_names()[i]);
    CHECK(nn::is_lora_param(model.parameter_names()[i]));
    CHECK(optimizer.params()[i].is_same(model.parameters()[i]));
    adapters += parallel::global_numel(model.parameters()[i]);
  }
  CHECK(model.parameters().size() == 2 * 3 * 6);  // wq, wv, w2 of debugmodel's 6 blocks
  CHECK(model.counts().trainable_params == adapters);
  for (size_t i = 0; i < start.size(); ++i) {
    INFO(model.frozen_parameter_names()[i]);
    CHECK_FALSE(nn::is_lora_param(model.frozen_parameter_names()[i]));
    CHECK_FALSE(model.frozen_parameters()[i].grad().defined());
    CHECK(at::equal(model.frozen_parameters()[i].detach(), start[i]));
  }
  // The adapters trained: the loss moved and B left zero.
  const auto& losses = trainer.core().loss_history();
  REQUIRE(losses.size() == 3);
  CHECK(losses.back() != losses.front());
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    if (model.parameter_names()[i].ends_with("lora_b.weight"))
      CHECK(model.parameters()[i].abs().max().item<double>() > 0);
  }
}

TEST_CASE("an adapter-only LoRA checkpoint resumes on the base of initial_load_path bitwise",
          "[train][lora][checkpoint][full]") {
  test::TempDir dir;
  // The base: a seed checkpoint of the plain model.
  Trainer<llama3::Llama3>(test::seed_checkpoint_job(dir.path / "seed", /*seed=*/9)).train();
  const fs::path base = test::seed_checkpoint_file(dir.path / "seed");
  REQUIRE(fs::exists(base));

  JobConfig c = lora_job(dir.path / "run", 4);
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.initial_load_path = base.string();
  c.lora.save_adapter_only = true;
  Trainer<llama3::Llama3> straight(c);
  straight.train();
  const std::vector<double> want = straight.core().loss_history();
  const fs::path step2 = dir.path / "run" / "checkpoint" / "step-2";
  const std::map<std::string, std::string> keys = index_keys(step2);
  int64_t adapters = 0;
  for (const auto& [key, group] : keys) {
    INFO(key);
    CHECK(group != "model");  // no base weight
    adapters += group == "lora" ? 1 : 0;
  }
  CHECK(adapters == 2 * 3 * 6);
  CHECK(keys.contains("optimizer.layers.0.attention.wq.lora_a.weight.exp_avg"));
  // The final model-only save holds the adapters alone too.
  for (const auto& [key, group] : index_keys(dir.path / "run" / "checkpoint" / "step-4")) CHECK(group == "lora");

  c.checkpoint.load_step = 2;
  Trainer<llama3::Llama3> resumed(c);
  resumed.train();
  const std::vector<double> got = resumed.core().loss_history();
  REQUIRE(want.size() == 4);
  REQUIRE(got.size() == 2);
  CHECK(got[0] == want[2]);  // deterministic CPU fp32: the same base, adapters, optimizer state and data
  CHECK(got[1] == want[3]);
  // Both ran on the seed checkpoint's base (its seed is not theirs: their own init would differ).
  const checkpoint::SafetensorsFile seed_file(base);
  const RankModel<llama3::Llama3>& model = resumed.rank_model();
  REQUIRE(model.frozen_parameters().size() == straight.rank_model().frozen_parameters().size());
  for (size_t i = 0; i < model.frozen_parameters().size(); ++i) {
    INFO(model.frozen_parameter_names()[i]);
    const at::Tensor want_base = seed_file.read(model.frozen_parameter_names()[i]);
    CHECK(at::equal(model.frozen_parameters()[i], want_base));
    CHECK(at::equal(straight.rank_model().frozen_parameters()[i], want_base));
  }
}

}  // namespace lora_trainer_test
