// SPDX-License-Identifier: BSD-3-Clause
// The trainer tests' common job: the debug model on tinyshakespeare with the tests' BPE tokenizer,
// one intra-op thread, a fixed seed. Each test sets what it is about on top.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include "test_util.hpp"
#include "titan/core/config.hpp"

namespace titan::test {

inline JobConfig tinyshakespeare_job(const std::filesystem::path& dump, int64_t seq_len, int64_t local_batch,
                                     int64_t steps, int64_t seed) {
  JobConfig c;
  c.job.dump_folder = dump.string();
  c.model.flavor = "debugmodel";
  c.model.hf_assets_path = test_tokenizer().string();
  c.training.dataset = "tinyshakespeare";
  c.training.dataset_path = tinyshakespeare().string();
  c.training.seq_len = seq_len;
  c.training.local_batch_size = local_batch;
  c.training.steps = steps;
  c.training.num_threads = 1;
  c.debug.seed = seed;
  return c;
}

/// The one entry of `folder` whose name starts with `prefix` (a run's timestamped folder, a W&B run); fails the
/// test when there are none or several.
/// A one-step job that writes the seed checkpoint of its model (seed_checkpoint_file): a base for others to load.
inline JobConfig seed_checkpoint_job(const std::filesystem::path& dump, int64_t seed) {
  JobConfig c = tinyshakespeare_job(dump, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/1, seed);
  c.checkpoint.create_seed_checkpoint = true;
  return c;
}

/// Where seed_checkpoint_job(dump, ...) writes.
inline std::filesystem::path seed_checkpoint_file(const std::filesystem::path& dump) {
  return dump / "checkpoint" / "seed.safetensors";
}

inline std::filesystem::path only_entry(const std::filesystem::path& folder, std::string_view prefix = "") {
  std::vector<std::filesystem::path> found;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().filename().string().starts_with(prefix)) found.push_back(entry.path());
  }
  INFO(folder.string() << ", entries starting with '" << prefix << "'");
  REQUIRE(found.size() == 1);
  return found[0];
}

/// Validation of one-batch steps (batch 2, seq 32) on tinyshakespeare every `freq` steps, `steps` batches each.
inline void validate_tinyshakespeare(JobConfig& c, int64_t freq, int64_t steps) {
  c.validation.enable = true;
  c.validation.dataset = "tinyshakespeare";
  c.validation.dataset_path = c.training.dataset_path;
  c.validation.freq = freq;
  c.validation.steps = steps;
  c.validation.local_batch_size = 2;
  c.validation.seq_len = 32;
}

/// The run the metrics sinks' tests log (TensorBoard, W&B): 5 steps of seq 32, batch 2, logged at steps 1, 2,
/// 4 and 5, a one-batch validation at 2 and 4, metrics.jsonl on, the sinks' folder `board`.
inline JobConfig metrics_sink_job(const std::filesystem::path& dump) {
  JobConfig c = tinyshakespeare_job(dump, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/5, /*seed=*/1);
  c.metrics.log_freq = 2;
  c.metrics.enable_jsonl = true;
  c.metrics.save_tb_folder = "board";
  validate_tinyshakespeare(c, /*freq=*/2, /*steps=*/1);
  return c;
}

/// A short deterministic run without AC (seq 64, batch 4, warmup 2, log every 10 steps): the base the
/// precision tests (bf16, float8) compare against fp32.
inline JobConfig short_precision_job(const std::filesystem::path& dump, int64_t steps) {
  JobConfig c = tinyshakespeare_job(dump, /*seq_len=*/64, /*local_batch=*/4, steps, /*seed=*/42);
  c.lr_scheduler.warmup_steps = 2;
  c.lr_scheduler.decay_ratio = 0.8;
  c.metrics.log_freq = 10;
  c.metrics.disable_color_printing = true;
  c.debug.deterministic = true;
  c.activation_checkpoint.mode = AcMode::none;
  return c;
}

}  // namespace titan::test
