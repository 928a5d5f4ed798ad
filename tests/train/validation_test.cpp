// SPDX-License-Identifier: BSD-3-Clause
// Validation in the trainer: validation.freq / validation.steps, the loss and perplexity written
// with the training metrics.
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace fs = std::filesystem;

TEST_CASE("Validation: every validation.freq steps the loss and perplexity go to the metrics", "[train]") {
  titan::test::TempDir dir;
  titan::JobConfig c =
      titan::test::tinyshakespeare_job(dir.path, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/4, /*seed=*/1);
  c.metrics.log_freq = 2;
  c.metrics.enable_jsonl = true;
  titan::test::validate_tinyshakespeare(c, /*freq=*/2, /*steps=*/3);
  titan::Trainer<titan::llama3::Llama3> trainer(c);
  trainer.train();

  std::ifstream in(dir.path / "metrics.jsonl");
  REQUIRE(in.good());
  std::vector<nlohmann::json> validations;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("validation_metrics/loss")) validations.push_back(record);
  }
  REQUIRE(validations.size() == 2);  // steps 2 and 4
  CHECK(validations[0].at("step") == 2);
  CHECK(validations[1].at("step") == 4);
  for (const auto& v : validations) {
    const double loss = v.at("validation_metrics/loss").get<double>();
    CHECK(std::isfinite(loss));
    CHECK(loss > 0);
    CHECK(v.at("validation_metrics/perplexity").get<double>() == Approx(std::exp(loss)));
    CHECK(v.at("validation_metrics/tokens") == 3 * 2 * 32);  // validation.steps batches of 2 x 32 labels
  }
  // The same validation set, a model trained two more steps: the loss moved.
  CHECK(validations[0].at("validation_metrics/loss") != validations[1].at("validation_metrics/loss"));
}
