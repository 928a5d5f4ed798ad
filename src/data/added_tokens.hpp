// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: added/special tokens, cut out of the text before pre-tokenization with
// HF's rules (leftmost-longest match; lstrip, rstrip, single_word; non-normalized tokens first).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data::detail {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

/// A piece of input text: an added token (`id` >= 0) or plain text to pre-tokenize (`id` < 0).
struct TextPiece {
  std::string_view text;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  /// Appends the segments of `text` to `out`; together they cover `text` in order.
  void split(std::string_view text, std::vector<TextPiece>& out) const;

 private:
  struct Pass {
    std::vector<uint32_t> by_first_byte[256];  // indices into tokens_, longest first
    bool any = false;
  };
  void split_pass(const Pass& pass, std::string_view text, std::vector<TextPiece>& out) const;

  std::vector<AddedToken> tokens_;
  Pass raw_;         // normalized == false: matched on the input text
  Pass normalized_;  // normalized == true: matched on what is left (we support no normalizer)
};

}  // namespace titan::data::detail
