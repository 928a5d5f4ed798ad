// SPDX-License-Identifier: BSD-3-Clause
// Added-token matching as in HF tokenizers' AddedVocabulary::find_matches. The token sets are small
// (a few hundred at most), so candidates are bucketed by first byte instead of an Aho-Corasick trie.
#include "added_tokens.hpp"

#include <algorithm>

#include "unicode.hpp"

namespace titan::data::detail {
namespace {

// \w of Rust's regex crate, approximated by letters, numbers and '_' (marks are not in our table).
bool is_word_char(char32_t c) {
  const CharClass cls = char_class(c);
  return c == '_' || cls == CharClass::letter || cls == CharClass::number;
}

char32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return decode_utf8(s, i).cp;
}

// Start of the whitespace at the end of s[0, end).
size_t trailing_space_start(std::string_view s, size_t end) {
  while (end > 0) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    if (char_class(decode_utf8(s, i).cp) != CharClass::space) break;
    end = i;
  }
  return end;
}

size_t leading_space_end(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    const Utf8Char c = decode_utf8(s, pos);
    if (char_class(c.cp) != CharClass::space) break;
    pos += c.len;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) continue;
    Pass& pass = t.normalized ? normalized_ : raw_;
    pass.by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(i);
    pass.any = true;
  }
  for (Pass* pass : {&raw_, &normalized_}) {
    for (auto& bucket : pass->by_first_byte) {
      std::stable_sort(bucket.begin(), bucket.end(),
                       [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
    }
  }
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextPiece>& out) const {
  if (!normalized_.any) {
    split_pass(raw_, text, out);
    return;
  }
  std::vector<TextPiece> first;
  split_pass(raw_, text, first);
  for (const TextPiece& s : first) {
    if (s.id >= 0) {
      out.push_back(s);
    } else {
      split_pass(normalized_, s.text, out);
    }
  }
}

void AddedTokenMatcher::split_pass(const Pass& pass, std::string_view text, std::vector<TextPiece>& out) const {
  if (!pass.any) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  size_t emitted = 0;  // end of what is already in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* match = nullptr;
    for (uint32_t i : pass.by_first_byte[static_cast<unsigned char>(text[pos])]) {
      if (text.compare(pos, tokens_[i].content.size(), tokens_[i].content) == 0) {
        match = &tokens_[i];
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + match->content.size();
    pos = stop;
    if (match->single_word) {
      const bool word_before = start > 0 && is_word_char(last_char(text.substr(0, start)));
      const bool word_after = stop < text.size() && is_word_char(decode_utf8(text, stop).cp);
      if (word_before || word_after) continue;
    }
    if (match->lstrip) start = std::max(trailing_space_start(text, start), emitted);
    if (match->rstrip) stop = leading_space_end(text, stop);
    if (emitted < start) out.push_back({text.substr(emitted, start - emitted), -1});
    out.push_back({text.substr(start, stop - start), match->id});
    emitted = stop;
    pos = std::max(pos, stop);
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1});
}

}  // namespace titan::data::detail
