// SPDX-License-Identifier: BSD-3-Clause
// DataLoader: strided data-parallel reads of TextDataset windows into (B, S) int64 tensors.
#include "titan/data/dataloader.hpp"

#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <vector>

#include "titan/core/error.hpp"

namespace titan::data {

DataLoader::DataLoader(std::shared_ptr<const Corpus> corpus, std::shared_ptr<const Tokenizer> tokenizer,
                       DataLoaderConfig config)
    : config_(config), dataset_(std::move(corpus), std::move(tokenizer), config.seq_len) {
  TITAN_CHECK_VALUE(config_.local_batch_size >= 1, "[titan::data::DataLoader] expected training.local_batch_size >= 1, "
                    "got {}.", config_.local_batch_size);
  TITAN_CHECK_VALUE(config_.dp_degree >= 1 && config_.dp_rank >= 0 && config_.dp_rank < config_.dp_degree,
                    "[titan::data::DataLoader] expected 0 <= dp_rank < dp_degree, got dp_rank {} and dp_degree {}.",
                    config_.dp_rank, config_.dp_degree);
}

Batch DataLoader::next() {
  const int64_t B = config_.local_batch_size, S = config_.seq_len;
  at::Tensor input = at::empty({B, S}, at::kLong);
  at::Tensor labels = at::empty({B, S}, at::kLong);
  auto* in = input.data_ptr<int64_t>();
  auto* lab = labels.data_ptr<int64_t>();
  std::vector<int32_t> window(size_t(S + 1));
  for (int64_t b = 0; b < B; ++b) {
    // Every rank walks the whole global stream and keeps its own stride, so after each sample all
    // ranks stand at the same window boundary (which is what makes state() rank-independent).
    for (int64_t r = 0; r < config_.dp_rank; ++r) dataset_.skip_window();
    dataset_.next_window(window);
    for (int64_t r = config_.dp_rank + 1; r < config_.dp_degree; ++r) dataset_.skip_window();
    for (int64_t t = 0; t < S; ++t) {
      in[b * S + t] = window[size_t(t)];
      lab[b * S + t] = window[size_t(t + 1)];
    }
  }
  return {std::move(input), std::move(labels)};
}

nlohmann::json DataLoader::state() const {
  return {{"version", 1}, {"dataset", dataset_.state()}, {"dp_degree", config_.dp_degree},
          {"local_batch_size", config_.local_batch_size}};
}

void DataLoader::load_state(const nlohmann::json& state) {
  TITAN_CHECK_VALUE(state.is_object() && state.value("version", 0) == 1 && state.contains("dataset"),
                    "[titan::data::DataLoader] expected a state {{\"version\": 1, \"dataset\": ...}}, got {}.",
                    state.dump().substr(0, 200));
  dataset_.load_state(state.at("dataset"));
}

}  // namespace titan::data
