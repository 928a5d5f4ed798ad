// SPDX-License-Identifier: BSD-3-Clause
// Hand-written scanners for the GPT-2 and Llama 3 split regexes (std::regex is neither Unicode-aware
// nor fast), and the byte-level alphabet. Each alternative's backtracking is spelled out below.
#include "titan/data/pre_tokenizer.hpp"

#include <array>

#include "unicode.hpp"

namespace titan::data {
namespace {

using detail::CharClass;

constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Ch {
  char32_t cp = 0;
  uint32_t len = 0;  // 0 at the end of the text
  CharClass cls = CharClass::other;
};

class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}

  Ch at(size_t pos) const {
    if (pos >= s_.size()) return {};
    const auto u = detail::decode_utf8(s_, pos);
    return {u.cp, u.len, detail::char_class(u.cp)};
  }
  // End of the run of characters of class `cls` starting at `pos`.
  size_t run(size_t pos, CharClass cls) const {
    for (Ch c = at(pos); c.len != 0 && c.cls == cls; c = at(pos)) pos += c.len;
    return pos;
  }
  size_t run_crlf(size_t pos) const {
    while (pos < s_.size() && (s_[pos] == '\r' || s_[pos] == '\n')) ++pos;
    return pos;
  }
  // `\s+(?!\S)|\s+` at a whitespace character: the whole run when it ends the text; otherwise the
  // lookahead forces backtracking by one character, unless the run is a single character (then
  // the plain `\s+` alternative takes it).
  size_t whitespace_tail(size_t pos) const {
    const size_t end = run(pos, CharClass::space);
    if (end == s_.size()) return end;
    size_t last = pos, p = pos;
    while (p < end) {
      last = p;
      p += at(p).len;
    }
    return last > pos ? last : end;
  }
  // Length of a contraction ('s 't 're 've 'm 'll 'd) at `pos`, or 0. Case-insensitive matching
  // follows Oniguruma's case folding, under which 's also matches U+017F LATIN SMALL LETTER LONG S.
  size_t contraction(size_t pos, bool ignore_case) const {
    if (s_[pos] != '\'' || pos + 1 >= s_.size()) return 0;
    auto lower = [&](size_t i) -> char {
      if (i >= s_.size()) return 0;
      const char c = s_[i];
      return ignore_case && c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c;
    };
    const char a = lower(pos + 1), b = lower(pos + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' || a == 'v') && b == 'e') return 3;
    if (a == 'l' && b == 'l') return 3;
    if (ignore_case && s_.substr(pos + 1, 2) == "\xC5\xBF") return 3;
    return 0;
  }

  // One piece starting at `pos`, returns its end.
  size_t gpt2(size_t pos) const {
    if (size_t n = contraction(pos, false)) return pos + n;
    const Ch c = at(pos);
    const bool space_prefix = c.cp == ' ';
    const Ch next = space_prefix ? at(pos + 1) : Ch{};
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: a leading space joins the run that follows it.
    for (CharClass cls : {CharClass::letter, CharClass::number, CharClass::other}) {
      if (space_prefix && next.len != 0 && next.cls == cls) return run(pos + 1, cls);
      if (c.cls == cls) return run(pos, cls);
    }
    return whitespace_tail(pos);
  }

  size_t llama3(size_t pos) const {
    if (size_t n = contraction(pos, true)) return pos + n;
    const Ch c = at(pos);
    const bool crlf = c.cp == '\r' || c.cp == '\n';
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if (c.cls == CharClass::letter) return run(pos, CharClass::letter);
    if (!crlf && c.cls != CharClass::number) {
      const Ch next = at(pos + c.len);
      if (next.len != 0 && next.cls == CharClass::letter) return run(pos + c.len, CharClass::letter);
    }
    // `\p{N}{1,3}`
    if (c.cls == CharClass::number) {
      size_t end = pos + c.len;
      for (int i = 1; i < 3; ++i) {
        const Ch d = at(end);
        if (d.len == 0 || d.cls != CharClass::number) break;
        end += d.len;
      }
      return end;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    if (c.cp == ' ') {
      const Ch next = at(pos + 1);
      if (next.len != 0 && next.cls == CharClass::other) return run_crlf(run(pos + 1, CharClass::other));
    }
    if (c.cls == CharClass::other) return run_crlf(run(pos, CharClass::other));
    // `\s*[\r\n]+`: \s* gives back characters until one is \r or \n, so the piece ends right
    // after the last line break of the whitespace run.
    const size_t end = run(pos, CharClass::space);
    size_t last_break = 0;
    for (size_t p = pos; p < end; p += at(p).len) {
      if (s_[p] == '\r' || s_[p] == '\n') last_break = p + 1;
    }
    if (last_break != 0) return last_break;
    return whitespace_tail(pos);
  }

 private:
  std::string_view s_;
};

constexpr std::array<char32_t, 256> make_byte_chars() {
  std::array<char32_t, 256> chars{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    chars[b] = printable ? char32_t(b) : next++;
  }
  return chars;
}
constexpr std::array<char32_t, 256> kByteChars = make_byte_chars();

}  // namespace

std::string_view split_pattern_regex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::gpt2:
      return kGpt2Regex;
    case SplitPattern::llama3:
      return kLlama3Regex;
    case SplitPattern::none:
      break;
  }
  return {};
}

std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::gpt2;
  if (regex == kLlama3Regex) return SplitPattern::llama3;
  return std::nullopt;
}

void split_pieces(std::string_view text, SplitPattern pattern, std::vector<std::string_view>& out) {
  if (pattern == SplitPattern::none) {
    if (!text.empty()) out.push_back(text);
    return;
  }
  const Scanner scanner(text);
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = pattern == SplitPattern::gpt2 ? scanner.gpt2(pos) : scanner.llama3(pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

char32_t byte_to_char(uint8_t b) { return kByteChars[b]; }

std::optional<uint8_t> char_to_byte(char32_t c) {
  static const auto inverse = [] {
    std::array<int16_t, 512> inv{};
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[kByteChars[b]] = int16_t(b);
    return inv;
  }();
  if (c >= inverse.size() || inverse[c] < 0) return std::nullopt;
  return uint8_t(inverse[c]);
}

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) detail::append_utf8(out, kByteChars[b]);
  return out;
}

std::optional<std::string> from_byte_level(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const auto u = detail::decode_utf8(token, i);
    const auto b = char_to_byte(u.cp);
    if (!b) return std::nullopt;
    out += char(*b);
    i += u.len;
  }
  return out;
}

}  // namespace titan::data
