// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/data_setup.hpp"

#include <cstdlib>
#include <filesystem>

#include "titan/core/log.hpp"
#include "titan/data/auto_tokenizer.hpp"
#include "titan/data/corpus.hpp"
#include "titan/data/dataloader.hpp"

namespace titan {
namespace {

std::shared_ptr<data::Corpus> training_corpus(const JobConfig& config) {
  return data::load_dataset(config.training.dataset, config.training.dataset_path.value_or(""));
}

// $TITAN_CACHE_DIR, else $XDG_CACHE_HOME/titan, else ~/.cache/titan: shared by every run on the machine.
std::filesystem::path cache_dir() {
  if (const char* dir = std::getenv("TITAN_CACHE_DIR")) return std::filesystem::path(dir) / "tokenizers";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) return std::filesystem::path(xdg) / "titan" / "tokenizers";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr ? home : ".") / ".cache" / "titan" / "tokenizers";
}

}  // namespace

std::shared_ptr<data::Tokenizer> build_tokenizer(const JobConfig& config, int64_t model_vocab_size) {
  // model.tokenizer_path is torchtitan's deprecated spelling of the same thing; it wins when set.
  const std::filesystem::path assets = config.model.tokenizer_path.value_or(config.model.hf_assets_path);
  const auto corpus = training_corpus(config);
  return data::tokenizer_for(assets, *corpus, model_vocab_size, cache_dir());
}

std::unique_ptr<data::DataLoader> build_dataloader(const JobConfig& config, std::shared_ptr<data::Tokenizer> tokenizer,
                                                   int64_t dp_rank, int64_t dp_degree) {
  return std::make_unique<data::DataLoader>(training_corpus(config), std::move(tokenizer),
                                            data::DataLoaderConfig{
                                                .local_batch_size = config.training.local_batch_size,
                                                .seq_len = config.training.seq_len,
                                                .dp_rank = dp_rank,
                                                .dp_degree = dp_degree,
                                            });
}

}  // namespace titan
