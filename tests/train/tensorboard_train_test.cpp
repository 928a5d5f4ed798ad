// SPDX-License-Identifier: BSD-3-Clause
// The trainer's TensorBoard event file, read by the oracle (the tensorboard package's EventAccumulator,
// tests/oracles/tensorboard_events.py): every scalar of every logged step, validation included, equals
// metrics.jsonl (as float32, TensorBoard's simple_value).
#include <fmt/format.h>

#include <vector>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace fs = std::filesystem;

TEST_CASE("TensorBoard: the tensorboard package reads every scalar of metrics.jsonl at every logged step",
          "[train][tensorboard]") {
  titan::test::TempDir dir;
  titan::JobConfig c =
      titan::test::tinyshakespeare_job(dir.path, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/5, /*seed=*/1);
  c.metrics.log_freq = 2;  // steps 1, 2, 4 and the last, 5
  c.metrics.enable_jsonl = true;
  c.metrics.enable_tensorboard = true;
  c.metrics.save_tb_folder = "board";
  c.validation.enable = true;
  c.validation.dataset = "tinyshakespeare";
  c.validation.dataset_path = c.training.dataset_path;
  c.validation.freq = 2;
  c.validation.steps = 1;
  c.validation.local_batch_size = 2;
  c.validation.seq_len = 32;
  {
    titan::Trainer<titan::llama3::Llama3> trainer(c);
    trainer.train();
  }
  // <dump>/board/<YYYYmmdd-HHMM>/events.out.tfevents.*, rank 0 only (no rank_<r> folder).
  std::vector<fs::path> runs;
  for (const auto& entry : fs::directory_iterator(dir.path / "board")) runs.push_back(entry.path());
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].filename().string().size() == std::string("20261201-0905").size());
  CHECK_FALSE(fs::exists(runs[0] / "rank_0"));
  // Logged steps 1, 2, 4, 5; 24 tags (training, memory, validation): empty or partial files fail.
  REQUIRE(titan::test::run_python("tensorboard_events.py",
                                  fmt::format("\"{}\" \"{}\" --min-steps=4 --min-tags=24", runs[0].string(),
                                              (dir.path / "metrics.jsonl").string())) == 0);
}
