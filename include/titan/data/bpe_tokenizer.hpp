// SPDX-License-Identifier: BSD-3-Clause
// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2, Llama 3, and what bpe_trainer.hpp
// writes), encoding exactly as the `tokenizers` library does. See docs/data.md for what is supported.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <memory>
#include <string>

#include "titan/data/tokenizer.hpp"

namespace titan::data {

class BpeTokenizer final : public Tokenizer {
 public:
  /// Reads tokenizer.json and, when `tokenizer_config` is non-empty, tokenizer_config.json (BOS/EOS
  /// and extra special tokens, as torchtitan reads them). Errors name the file and the key.
  static std::shared_ptr<BpeTokenizer> from_files(const std::filesystem::path& tokenizer_json,
                                                  const std::filesystem::path& tokenizer_config = {});

  /// The same from parsed documents; `source` and `config_source` name them in errors.
  static std::shared_ptr<BpeTokenizer> from_json(const nlohmann::json& tokenizer, std::string source,
                                                 const nlohmann::json* config = nullptr,
                                                 std::string config_source = {});

  ~BpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const override;
  int64_t vocab_size() const override;
  std::optional<int32_t> bos_id() const override;
  std::optional<int32_t> eos_id() const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int32_t id) const override;

  /// Whether the tokenizer's post-processor already adds BOS / EOS (e.g. Llama 3 adds BOS).
  bool post_processor_adds_bos() const;
  bool post_processor_adds_eos() const;

  struct Impl;

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::data
