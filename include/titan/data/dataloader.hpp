// SPDX-License-Identifier: BSD-3-Clause
// Batches of packed windows for one data-parallel rank. Rank r of N takes windows r, r+N, r+2N, ...
// of the one global window stream, so the samples of a global batch do not depend on the layout,
// and the saved state (identical on every rank) restores under any dp degree.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>

#include "titan/data/text_dataset.hpp"

namespace titan::data {

struct DataLoaderConfig {
  int64_t local_batch_size = 8;  ///< samples per rank per step (training.local_batch_size)
  int64_t seq_len = 2048;        ///< tokens per sample (training.seq_len)
  int64_t dp_rank = 0;           ///< this rank's index on the data-parallel axes (dp_replicate x dp_shard)
  int64_t dp_degree = 1;         ///< number of data-parallel ranks
};

struct Batch {
  at::Tensor input;   ///< (B, S) int64 token ids
  at::Tensor labels;  ///< (B, S) int64 next-token ids; -100 = ignore (packing never emits it)
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Corpus> corpus, std::shared_ptr<const Tokenizer> tokenizer, DataLoaderConfig config);

  /// The next local batch. Never runs out: the corpus is re-read with a logged epoch counter.
  Batch next();

  const DataLoaderConfig& config() const { return config_; }
  int64_t epoch() const { return dataset_.epoch(); }

  /// Position in the global stream at this step boundary: the same JSON on every dp rank.
  nlohmann::json state() const;
  /// Continues exactly where `state` was taken, also under another dp degree or rank.
  void load_state(const nlohmann::json& state);

 private:
  DataLoaderConfig config_;
  TextDataset dataset_;
};

}  // namespace titan::data
