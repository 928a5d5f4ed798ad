// SPDX-License-Identifier: BSD-3-Clause
// The Trainer with optimizer.name = "Muon": the model's spec decides what AdamW keeps (the embedding and the output
// head by role, the norms by shape), the matrices step with Muon, and their steps lower the loss: the same batches
// with the matrices held still (muon_lr 0, AdamW training the rest alone) end higher.
#include <numeric>

#include "test_util.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/optim/muon.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace muon_trainer_test {
namespace {

titan::JobConfig muon_job(const std::filesystem::path& dump, double muon_lr) {
  titan::JobConfig config =
      titan::test::tinyshakespeare_job(dump, /*seq_len=*/32, /*local_batch=*/4, /*steps=*/8, /*seed=*/3);
  titan::apply_override(config, "optimizer.name", "Muon");
  config.optimizer.lr = 2e-3;
  config.optimizer.muon_lr = muon_lr;
  config.lr_scheduler.warmup_steps = 0;
  config.lr_scheduler.decay_ratio = 0.0;  // a constant lr
  return config;
}

// The mean loss of steps 2-8 (step 1 runs before any update).
double mean_after_first(const std::vector<double>& losses) {
  return std::accumulate(losses.begin() + 1, losses.end(), 0.0) / static_cast<double>(losses.size() - 1);
}

}  // namespace

TEST_CASE("the Trainer steps the matrices with Muon and the embedding, head and norms with AdamW",
          "[train][optim][muon]") {
  titan::test::TempDir dir;
  titan::Trainer<titan::llama3::Llama3> trainer(muon_job(dir.path / "muon", 2e-2));
  const auto* muon = dynamic_cast<const titan::Muon*>(&trainer.core().optimizer());
  REQUIRE(muon != nullptr);
  const std::vector<std::string>& names = trainer.rank_model().parameter_names();
  int64_t matrices = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    INFO(names[i]);
    const bool hidden_matrix = names[i].starts_with("layers.") && names[i].find("norm") == std::string::npos;
    CHECK(muon->is_matrix(i) == hidden_matrix);
    matrices += muon->is_matrix(i) ? 1 : 0;
  }
  CHECK(matrices == 7 * titan::llama3::flavor("debugmodel").n_layers);
  trainer.train();
  titan::Trainer<titan::llama3::Llama3> still(muon_job(dir.path / "still", 0.0));
  still.train();
  const std::vector<double>& with = trainer.core().loss_history();
  const std::vector<double>& without = still.core().loss_history();
  REQUIRE(with.size() == 8);
  REQUIRE(without.size() == 8);
  CHECK(with[0] == without[0]);  // the same batch on the same initial weights
  // Measured 7.63 against 7.83 (AVX-512 Xeon): the matrices' steps are worth 0.2 nats on average here.
  INFO("mean loss of steps 2-8: " << mean_after_first(with) << " with Muon, " << mean_after_first(without)
                                  << " with the matrices still");
  CHECK(mean_after_first(with) < mean_after_first(without) - 0.1);
}

}  // namespace muon_trainer_test
