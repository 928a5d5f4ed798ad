// SPDX-License-Identifier: BSD-3-Clause
// Trains a byte-level BPE (GPT-2 style: 256 byte tokens, then merges by pair frequency) and writes
// it as a Hugging Face tokenizer.json + tokenizer_config.json that bpe_tokenizer.hpp and the HF
// `tokenizers` library both load and encode identically.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "titan/data/bpe_tokenizer.hpp"
#include "titan/data/pre_tokenizer.hpp"

namespace titan::data {

struct BpeTrainerConfig {
  /// Final vocabulary size: 256 byte tokens + merges + special tokens.
  int64_t vocab_size = 2048;
  /// Added as special tokens with the last ids, in this order.
  std::vector<std::string> special_tokens = {"<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"};
  std::string bos_token = "<|begin_of_text|>";  ///< one of special_tokens, or empty for none
  std::string eos_token = "<|end_of_text|>";    ///< one of special_tokens, or empty for none
  std::string pad_token = "<|pad|>";            ///< one of special_tokens, or empty for none
  /// The split before merging: gpt2 (ByteLevel's own regex) or llama3 (a Split pre-tokenizer).
  SplitPattern split = SplitPattern::gpt2;
};

/// A trained byte-level BPE: ids 0..255 are the bytes, then one token per merge, then the specials.
struct TrainedBpe {
  BpeTrainerConfig config;
  std::vector<std::string> vocab;                   ///< id -> token in the byte-level alphabet
  std::vector<std::pair<int32_t, int32_t>> merges;  ///< in rank order

  nlohmann::json tokenizer_json() const;
  nlohmann::json tokenizer_config_json() const;
  /// Writes tokenizer_config.json, then tokenizer.json (each atomically) into `dir`, creating it.
  void save(const std::filesystem::path& dir) const;
  std::shared_ptr<BpeTokenizer> tokenizer() const;
};

/// Usage: feed documents with add_text, then train(). Deterministic: the same texts in any
/// order give the same tokenizer (ties between equally frequent pairs go to the smaller ids).
class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainerConfig config = {});
  ~BpeTrainer();
  BpeTrainer(BpeTrainer&&) noexcept;
  BpeTrainer& operator=(BpeTrainer&&) noexcept;

  /// Pre-tokenizes `text` and counts its pieces.
  void add_text(std::string_view text);
  /// Bytes passed to add_text so far.
  int64_t bytes_seen() const;
  /// Learns merges until the vocabulary has config.vocab_size entries or no pair is left (then
  /// the vocabulary is smaller, with a warning).
  TrainedBpe train() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
