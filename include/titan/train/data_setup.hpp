// SPDX-License-Identifier: BSD-3-Clause
// Job config -> tokenizer and data loader (dataset registry, tokenizer trained on first use).
#pragma once

#include <memory>

#include "titan/core/config.hpp"

namespace titan::data {
class Tokenizer;
class DataLoader;
}  // namespace titan::data

namespace titan {

/// The tokenizer of model.hf_assets_path, or one trained on the dataset and cached on first use.
std::shared_ptr<data::Tokenizer> build_tokenizer(const JobConfig& config, int64_t model_vocab_size);

/// The training loader of this data-parallel rank.
std::unique_ptr<data::DataLoader> build_dataloader(const JobConfig& config, std::shared_ptr<data::Tokenizer> tokenizer,
                                                  int64_t dp_rank, int64_t dp_degree);

}  // namespace titan
