// SPDX-License-Identifier: BSD-3-Clause
// The trainer tests' common job: the debug model on tinyshakespeare with the tests' BPE tokenizer,
// one intra-op thread, a fixed seed. Each test sets what it is about on top.
#pragma once

#include <filesystem>

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
