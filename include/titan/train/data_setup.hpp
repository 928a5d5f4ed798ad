// SPDX-License-Identifier: BSD-3-Clause
// Job config -> tokenizer and data loaders (dataset registry, mixtures, tokenizer trained on first use).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "titan/core/config.hpp"

namespace titan::data {
class Tokenizer;
class DataLoader;
struct WeightedSource;
}  // namespace titan::data

namespace titan {
class RunContext;

/// The tokenizer of model.hf_assets_path, or one trained on the dataset and cached on first use. Logs
/// (warn) when the default corpus stands in for "c4_test" (see build_sources).
std::shared_ptr<data::Tokenizer> build_tokenizer(const JobConfig& config, int64_t model_vocab_size);
/// The same for every rank of a run: rank 0 first (a tokenizer trained on first use is cached, and the others read
/// it), then a check that it fits the model's vocabulary (an error names model.hf_assets_path).
std::shared_ptr<data::Tokenizer> build_tokenizer(const RunContext& run, int64_t model_vocab_size);

/// Microbatches per rank per step: training.global_batch_size / (local_batch_size x dp_degree)
/// (1 when global_batch_size is -1). Throws ConfigError when it does not divide.
int64_t gradient_accumulation_steps(const JobConfig& config, int64_t dp_degree);

/// The training sources: training.dataset_mixture, else training.dataset (at training.dataset_path),
/// with the training.dataset_* overrides applied. torchtitan's default dataset "c4_test" (its own C4
/// sample, not shipped with titan) given without a path reads the default corpus "fortunes" instead.
std::vector<data::WeightedSource> build_sources(const JobConfig& config);

/// The training loader of this data-parallel rank. Ranks that differ only in cp/tp/pp pass the same
/// dp_rank and get the same batches. Global batch = training.global_batch_size windows, split into
/// gradient_accumulation_steps(config, dp_degree) microbatches per rank.
std::unique_ptr<data::DataLoader> build_dataloader(const JobConfig& config, std::shared_ptr<data::Tokenizer> tokenizer,
                                                   int64_t dp_rank, int64_t dp_degree);

/// The one-pass validation loader of this rank: validation.dataset at validation.dataset_path,
/// validation.local_batch_size x validation.seq_len microbatches.
std::unique_ptr<data::DataLoader> build_validation_dataloader(const JobConfig& config,
                                                              std::shared_ptr<data::Tokenizer> tokenizer,
                                                              int64_t dp_rank, int64_t dp_degree);

}  // namespace titan
