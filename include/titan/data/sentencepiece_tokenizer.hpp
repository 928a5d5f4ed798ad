// SPDX-License-Identifier: BSD-3-Clause
// Sentencepiece models (Llama 2, Mistral, T5, ...) behind the Tokenizer interface, and training one
// with libsentencepiece's trainer (what `titan-tokenizer train --type sentencepiece` runs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "titan/data/tokenizer.hpp"

namespace titan::data {

/// Loads a sentencepiece `.model`; encodes exactly as the Python `sentencepiece` package does
/// (SentencePieceProcessor.encode, no sampling). BOS/EOS are the model's bos/eos pieces, if any.
/// Throws c10::ValueError naming the file when it is missing or not a model.
std::shared_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model_file);

struct SentencePieceTrainerConfig {
  int64_t vocab_size = 8000;              ///< pieces, special ones included
  std::string model_type = "bpe";         ///< bpe, unigram, char or word
  double character_coverage = 1.0;        ///< share of characters covered by pieces (0.9995 for CJK-heavy text)
  bool byte_fallback = true;              ///< unknown characters become <0xNN> byte pieces instead of <unk>
  int64_t input_sentence_size = 0;        ///< lines sampled for training (0 = all)
  int64_t max_sentence_length = 1 << 16;  ///< longer lines are skipped by the trainer (bytes)
  int64_t num_threads = 1;                ///< trainer threads
};

/// Trains on the lines of `inputs` and writes `<model_prefix>.model` and `<model_prefix>.vocab`;
/// returns the .model path. Throws c10::ValueError with the trainer's message on failure.
std::filesystem::path train_sentencepiece(const std::vector<std::filesystem::path>& inputs,
                                          const std::filesystem::path& model_prefix,
                                          const SentencePieceTrainerConfig& config = {});

}  // namespace titan::data
