// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: UTF-8 decoding and the Unicode classes (\p{L}, \p{N}, \s) the scanners need.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace titan::data::detail {

/// Classes as Oniguruma sees them: `space` is the White_Space property (\s), `letter` \p{L},
/// `number` \p{N}; the three are disjoint.
enum class CharClass : uint8_t { other = 0, letter = 1, number = 2, space = 3 };

CharClass char_class(char32_t c);

/// One decoded character: `len` bytes at the decode position. A byte that does not start a valid
/// UTF-8 sequence decodes as kInvalidChar with len 1, so every byte string can be scanned.
struct Utf8Char {
  char32_t cp;
  uint32_t len;
};
inline constexpr char32_t kInvalidChar = 0x110000;

Utf8Char decode_utf8(std::string_view s, size_t pos);

void append_utf8(std::string& out, char32_t c);

/// `s` with each maximal invalid UTF-8 subsequence replaced by U+FFFD (Rust's from_utf8_lossy,
/// Python's errors="replace"), which is what HF's byte-level decoder returns.
std::string utf8_lossy(std::string_view s);

}  // namespace titan::data::detail
