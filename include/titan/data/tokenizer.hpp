// SPDX-License-Identifier: BSD-3-Clause
// The tokenizer interface the data pipeline and generation use, and the loader for Hugging Face
// tokenizer folders. The byte-level BPE implementation is in bpe_tokenizer.hpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

/// Text <-> token ids. Implementations are immutable after construction and safe to share between
/// threads (encode may be called concurrently).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text`. BOS/EOS are added when asked for, or when the tokenizer's own
  /// post-processor adds them (as HF `encode` does), but never twice (torchtitan's rule).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos = false, bool add_eos = false) const = 0;

  /// The text of `ids`. Ids with no token are skipped and invalid UTF-8 becomes U+FFFD (as HF
  /// decode does); special tokens are kept unless `skip_special_tokens`.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const = 0;

  /// One past the largest token id, added tokens included: the embedding rows a model needs.
  virtual int64_t vocab_size() const = 0;

  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;

  /// The id of a token given in its vocabulary spelling (byte-level form for BPE vocab entries, the
  /// plain content for added tokens), or nullopt.
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;

  /// The vocabulary spelling of `id`, or nullopt when no token has it.
  virtual std::optional<std::string> id_to_token(int32_t id) const = 0;
};

/// Loads a Hugging Face tokenizer: a folder holding tokenizer.json (and usually
/// tokenizer_config.json, which names BOS/EOS), or a path to a tokenizer.json whose folder may hold
/// the config. Throws c10::ValueError naming the file when it is missing or invalid.
///
/// Example:
///   auto tok = titan::data::load_tokenizer("assets/tokenizer");
///   std::vector<int32_t> ids = tok->encode("Hello", /*add_bos=*/true, /*add_eos=*/true);
std::shared_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir_or_file);

}  // namespace titan::data
