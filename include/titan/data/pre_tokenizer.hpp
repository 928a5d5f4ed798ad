// SPDX-License-Identifier: BSD-3-Clause
// The text splitting a byte-level BPE does before merging: the GPT-2 and Llama 3 regexes as
// hand-written Unicode-aware scanners, and GPT-2's byte-to-unicode alphabet. See docs/data.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

/// A pre-tokenizer regex we have a scanner for. Each scanner yields exactly the pieces the
/// Oniguruma regex in Hugging Face `tokenizers` yields (leftmost-first alternation, backtracking).
enum class SplitPattern : uint8_t {
  none,    ///< no split: the whole text is one piece (ByteLevel with use_regex = false)
  gpt2,    ///< 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  llama3,  ///< (?i:'s|..|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
};

/// The regex source of `pattern`, as written in a tokenizer.json (empty for `none`).
std::string_view split_pattern_regex(SplitPattern pattern);

/// The pattern whose regex source is exactly `regex`, or nullopt when we have no scanner for it.
std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex);

/// Appends the pieces of `text` to `out` as views into `text`; they cover `text` exactly, in order.
/// Invalid UTF-8 bytes are kept, each as a one-byte piece character of class "other".
void split_pieces(std::string_view text, SplitPattern pattern, std::vector<std::string_view>& out);

/// GPT-2's `bytes_to_unicode`: the printable code point standing for byte `b` in a byte-level vocab.
char32_t byte_to_char(uint8_t b);

/// The byte a byte-level code point stands for, or nullopt when `c` is not in the alphabet.
std::optional<uint8_t> char_to_byte(char32_t c);

/// The byte-level form of raw bytes: each byte replaced by the UTF-8 of `byte_to_char(byte)`.
std::string to_byte_level(std::string_view bytes);

/// The raw bytes of a byte-level token, or nullopt when a character is outside the alphabet.
std::optional<std::string> from_byte_level(std::string_view token);

}  // namespace titan::data
