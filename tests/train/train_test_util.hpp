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

}  // namespace titan::test
