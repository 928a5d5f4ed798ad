// SPDX-License-Identifier: BSD-3-Clause
// Packing as torchtitan v0.2.2's HuggingFaceTextDataset does it: each document is tokenized with
// BOS + EOS and appended to one token stream, which is cut into non-overlapping windows of
// seq_len + 1 tokens (input = w[:-1], labels = w[1:]). The stream loops over the corpus forever.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "titan/data/corpus.hpp"
#include "titan/data/tokenizer.hpp"

namespace titan::data {

class TextDataset {
 public:
  TextDataset(std::shared_ptr<const Corpus> corpus, std::shared_ptr<const Tokenizer> tokenizer, int64_t seq_len);

  /// Copies the next window (seq_len + 1 tokens) into `out`.
  void next_window(std::span<int32_t> out);
  /// Moves past the next window without copying it (other data-parallel ranks' windows).
  void skip_window();

  int64_t seq_len() const { return seq_len_; }
  /// Completed passes over the corpus.
  int64_t epoch() const { return epoch_; }
  /// Windows produced or skipped since the start of training.
  int64_t windows() const { return windows_; }
  const Corpus& corpus() const { return *corpus_; }

  /// Where the stream is: next document, epoch, windows so far and the tokens carried over.
  /// load_state on a dataset over the same corpus continues with exactly the next window.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  // Tokenizes documents until the buffer holds a whole window.
  void fill();

  std::shared_ptr<const Corpus> corpus_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t seq_len_;
  int64_t document_ = 0;  // next document to tokenize
  int64_t epoch_ = 0;
  int64_t windows_ = 0;
  int64_t empty_run_ = 0;       // consecutive documents that gave no tokens
  std::vector<int32_t> buffer_;  // tokens not yet in a window start at buffer_[head_]
  size_t head_ = 0;
};

}  // namespace titan::data
