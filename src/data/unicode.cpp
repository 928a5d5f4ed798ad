// SPDX-License-Identifier: BSD-3-Clause
// Unicode classes from the generated range table (scripts/gen_unicode_tables.py) and UTF-8 codecs.
#include "unicode.hpp"

#include <algorithm>
#include <array>

namespace titan::data::detail {
namespace {

struct Range {
  char32_t first, last;
  uint8_t cls;
};

constexpr Range kRanges[] = {
#include "unicode_tables.inc"
};

bool is_white_space(char32_t c) {
  // The White_Space property, which is Oniguruma's \s for UTF-8 (not Python's str.isspace, which
  // also counts U+001C..U+001F).
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

CharClass lookup(char32_t c) {
  if (is_white_space(c)) return CharClass::space;
  const auto* it = std::upper_bound(std::begin(kRanges), std::end(kRanges), c,
                                    [](char32_t v, const Range& r) { return v < r.first; });
  if (it == std::begin(kRanges)) return CharClass::other;
  --it;
  return c <= it->last ? static_cast<CharClass>(it->cls) : CharClass::other;
}

// The BMP is where nearly all text lives: one byte per code point, built once.
const std::array<CharClass, 0x10000>& bmp_table() {
  static const auto table = [] {
    std::array<CharClass, 0x10000> t{};
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = lookup(c);
    return t;
  }();
  return table;
}

}  // namespace

CharClass char_class(char32_t c) {
  if (c < 0x10000) return bmp_table()[c];
  return c >= kInvalidChar ? CharClass::other : lookup(c);
}

Utf8Char decode_utf8(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const size_t left = s.size() - pos;
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {b0, 1};
  auto cont = [&](size_t i) { return i < left && (p[i] & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(1)) return {char32_t((b0 & 0x1F) << 6 | (p[1] & 0x3F)), 2};
  if (b0 >= 0xE0 && b0 <= 0xEF && cont(1) && cont(2)) {
    const char32_t c = (b0 & 0x0F) << 12 | (p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    if (c >= 0x800 && (c < 0xD800 || c > 0xDFFF)) return {c, 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    const char32_t c = (b0 & 0x07) << 18 | (p[1] & 0x3F) << 12 | (p[2] & 0x3F) << 6 | (p[3] & 0x3F);
    if (c >= 0x10000 && c <= 0x10FFFF) return {c, 4};
  }
  return {kInvalidChar, 1};
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const Utf8Char ch = decode_utf8(s, i);
    if (ch.cp != kInvalidChar) {
      out.append(s.substr(i, ch.len));
      i += ch.len;
      continue;
    }
    // Skip the maximal prefix of a valid sequence (Unicode's "maximal subpart" rule), then emit
    // one U+FFFD for it.
    const unsigned char b0 = p[i];
    size_t need = 0;                     // continuation bytes the lead byte asks for
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first one (no overlongs, surrogates)
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      lo = b0 == 0xE0 ? 0xA0 : 0x80;
      hi = b0 == 0xED ? 0x9F : 0xBF;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      lo = b0 == 0xF0 ? 0x90 : 0x80;
      hi = b0 == 0xF4 ? 0x8F : 0xBF;
    }
    size_t j = i + 1;
    for (size_t k = 0; k < need && j < s.size(); ++k, ++j) {
      const unsigned char b = p[j];
      if (b < lo || b > hi) break;
      lo = 0x80;
      hi = 0xBF;
    }
    out += "\xEF\xBF\xBD";
    i = j;
  }
  return out;
}

}  // namespace titan::data::detail
