// SPDX-License-Identifier: BSD-3-Clause
// The trainer's TensorBoard event file, read by the oracle (the tensorboard package's EventAccumulator,
// tests/oracles/tensorboard_events.py): every scalar of every logged step, validation included, equals
// metrics.jsonl (as float32, TensorBoard's simple_value).
#include <fmt/format.h>

#include "test_util.hpp"
#include "titan/core/config.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace fs = std::filesystem;

TEST_CASE("TensorBoard: the tensorboard package reads every scalar of metrics.jsonl at every logged step",
          "[train][tensorboard]") {
  titan::test::TempDir dir;
  titan::JobConfig c = titan::test::metrics_sink_job(dir.path);  // logs steps 1, 2, 4, 5
  c.metrics.enable_tensorboard = true;
  {
    titan::Trainer<titan::llama3::Llama3> trainer(c);
    trainer.train();
  }
  // <dump>/board/<YYYYmmdd-HHMM>/events.out.tfevents.*, rank 0 only (no rank_<r> folder).
  const fs::path stamp = titan::test::only_entry(dir.path / "board");
  CHECK(stamp.filename().string().size() == std::string("20261201-0905").size());
  CHECK_FALSE(fs::exists(stamp / "rank_0"));
  // Logged steps 1, 2, 4, 5; 24 tags (training, memory, validation): empty or partial files fail.
  REQUIRE(titan::test::run_python("tensorboard_events.py",
                                  fmt::format("\"{}\" \"{}\" --min-steps=4 --min-tags=24", stamp.string(),
                                              (dir.path / "metrics.jsonl").string())) == 0);
}
