// SPDX-License-Identifier: BSD-3-Clause
// The tokenizer for a run: the one in model.hf_assets_path, or else a byte-level BPE trained on the
// training corpus on first use and cached, so a fresh checkout trains on fortunes with no downloads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "titan/data/bpe_trainer.hpp"
#include "titan/data/corpus.hpp"
#include "titan/data/tokenizer.hpp"

namespace titan::data {

struct AutoTokenizerOptions {
  int64_t max_training_bytes = int64_t(4) << 20;  ///< train on the corpus's first documents up to this size
  BpeTrainerConfig trainer;                       ///< its vocab_size is replaced by tokenizer_for's
};

/// `hf_assets_path`'s tokenizer.json when there is one; otherwise a BPE of `vocab_size` trained on
/// `corpus`, kept in `cache_dir`/<dataset>-v<vocab_size>-<hash of the corpus files and sizes>/ and
/// reused while the corpus is unchanged. Concurrent callers (ranks) may both train; one publishes.
std::shared_ptr<Tokenizer> tokenizer_for(const std::filesystem::path& hf_assets_path, const Corpus& corpus,
                                         int64_t vocab_size, const std::filesystem::path& cache_dir,
                                         const AutoTokenizerOptions& options = {});

}  // namespace titan::data
