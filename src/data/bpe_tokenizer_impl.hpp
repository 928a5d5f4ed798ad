// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: the state of a BpeTokenizer, built by bpe_tokenizer_json.cpp (parsing) and
// used by bpe_tokenizer.cpp (encode/decode).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "added_tokens.hpp"
#include "bpe_model.hpp"
#include "titan/data/bpe_tokenizer.hpp"
#include "titan/data/pre_tokenizer.hpp"

namespace titan::data {

/// One pre-tokenizer step: optionally prepend a space to each piece, then split it.
struct PreTokenizerStep {
  bool add_prefix_space = false;
  SplitPattern split = SplitPattern::none;
};

struct BpeTokenizer::Impl {
  std::string source;  // the tokenizer.json path, for messages
  std::unique_ptr<detail::BpeModel> model;
  std::vector<std::string> model_tokens;  // id -> byte-level spelling ("" where no token)
  std::vector<PreTokenizerStep> steps;    // ByteLevel is always the last (byte mapping) step

  // Added tokens, with HF's AddedVocabulary semantics (ids of vocab entries are kept).
  detail::StringMap<int32_t> added_ids;
  std::map<int32_t, detail::AddedToken> added_by_id;
  detail::StringMap<bool> special_contents;
  detail::AddedTokenMatcher matcher;

  std::vector<int32_t> template_prefix, template_suffix;  // post-processor tokens around the text
  std::optional<int32_t> bos, eos;
  bool template_adds_bos = false, template_adds_eos = false;

  std::vector<std::string> decoded;  // id -> bytes the ByteLevel decoder gives for it
  std::vector<bool> is_special;      // id -> special added token

  std::optional<int32_t> find(std::string_view token) const;
  /// HF AddedVocabulary::add_tokens: content already known keeps its id, new content gets the next
  /// id after the vocabulary; properties of an existing added token are replaced.
  void add_tokens(const std::vector<detail::AddedToken>& tokens);
  /// Builds the matcher and the decode tables; call after the last add_tokens.
  void finalize();
};

}  // namespace titan::data
