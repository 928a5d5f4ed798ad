// SPDX-License-Identifier: BSD-3-Clause
#include "yaml_subset.hpp"

#include <charconv>
#include <optional>
#include <vector>

#include "titan/core/error.hpp"

namespace titan::eval::detail {
namespace {

struct Line {
  int number = 0;      // 1-based, for errors
  int indent = 0;      // leading spaces
  std::string text{};  // after the indentation, comment removed, right-trimmed
};

// Index of the first '#' that starts a comment (at the start or after a space, outside quotes), or npos.
size_t comment_start(std::string_view s) {
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote != 0) {
      if (c == '\\' && quote == '"')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if (c == '"' || c == '\'') {
      // A quote opens a quoted scalar only where a scalar starts; "it's" in a plain scalar is a letter.
      if (i == 0 || s[i - 1] == ' ' || s[i - 1] == '[' || s[i - 1] == ',' || s[i - 1] == ':') quote = c;
    } else if (c == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return i;
    }
  }
  return std::string_view::npos;
}

std::string_view trim_spaces(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

class Parser {
 public:
  Parser(std::string_view text, std::string file) : file_(std::move(file)) {
    int number = 0;
    size_t begin = 0;
    while (begin <= text.size()) {
      const size_t end = std::min(text.find('\n', begin), text.size());
      std::string_view raw = text.substr(begin, end - begin);
      ++number;
      begin = end + 1;
      if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
      const size_t indent = raw.find_first_not_of(' ');
      if (indent == std::string_view::npos) continue;
      fail_if(raw[indent] == '\t', number, "indentation by spaces, got a tab");
      std::string_view body = raw.substr(indent);
      body = body.substr(0, std::min(comment_start(body), body.size()));
      body = trim_spaces(body);
      if (body.empty()) continue;
      fail_if(body == "---" || body == "...", number, "one document without '---' or '...' markers, got '{}'", body);
      lines_.push_back({number, static_cast<int>(indent), std::string(body)});
    }
  }

  nlohmann::ordered_json document() {
    if (lines_.empty()) return nullptr;
    nlohmann::ordered_json out = block(lines_[0].indent);
    if (next_ < lines_.size())
      fail(lines_[next_].number, "the document to end, got more text at a smaller indentation");
    return out;
  }

 private:
  template <class... T>
  [[noreturn]] void fail(int line, fmt::format_string<T...> what, T&&... args) const {
    throw c10::ValueError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        fmt::format("[titan::eval] {}:{}: expected {}. titan-eval reads the part of YAML that lm-eval "
                    "task files use (mappings, '- ' sequences, plain or quoted one-line scalars, "
                    "[a, b] lists); write the value that way (a quoted string with \\n for "
                    "several lines).",
                    file_, line, fmt::format(what, std::forward<T>(args)...)));
  }
  template <class... T>
  void fail_if(bool bad, int line, fmt::format_string<T...> what, T&&... args) const {
    if (bad) fail(line, what, std::forward<T>(args)...);
  }

  static bool is_item(const std::string& text) { return text == "-" || text.starts_with("- "); }

  nlohmann::ordered_json block(int indent) { return is_item(lines_[next_].text) ? sequence(indent) : mapping(indent); }

  // The value of a key or item whose text ended at the line before next_: a nested block, or null.
  nlohmann::ordered_json nested(int indent, bool sequence_at_same_indent) {
    if (next_ >= lines_.size()) return nullptr;
    const Line& line = lines_[next_];
    if (line.indent > indent) return block(line.indent);
    if (sequence_at_same_indent && line.indent == indent && is_item(line.text)) return sequence(indent);
    return nullptr;
  }

  nlohmann::ordered_json mapping(int indent) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    while (next_ < lines_.size() && lines_[next_].indent == indent && !is_item(lines_[next_].text)) {
      const Line line = lines_[next_++];
      const auto [key, rest] = split_key(line);
      fail_if(out.contains(key), line.number, "each key once, got '{}' again", key);
      out[key] = rest.empty() ? nested(indent, /*sequence_at_same_indent=*/true) : scalar_or_list(rest, line.number);
    }
    fail_if(next_ < lines_.size() && lines_[next_].indent > indent, lines_[std::min(next_, lines_.size() - 1)].number,
            "a key at the indentation of its mapping, got a line indented further (a scalar continued on a new line?)");
    return out;
  }

  nlohmann::ordered_json sequence(int indent) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    while (next_ < lines_.size() && lines_[next_].indent == indent && is_item(lines_[next_].text)) {
      Line& line = lines_[next_];
      const std::string rest(trim_spaces(std::string_view(line.text).substr(1)));
      if (rest.empty()) {
        ++next_;
        out.push_back(nested(indent, /*sequence_at_same_indent=*/false));
      } else if (has_key(rest)) {
        // "- key: value": a mapping whose first line starts where `key` does.
        line.indent = indent + static_cast<int>(line.text.size() - rest.size());
        line.text = rest;
        out.push_back(mapping(line.indent));
      } else {
        ++next_;
        out.push_back(scalar_or_list(rest, line.number));
      }
    }
    return out;
  }

  // The position of the ':' that ends a key (followed by a space or the end), outside quotes; npos if none.
  static size_t key_colon(std::string_view text) {
    if (text.starts_with('"') || text.starts_with('\'')) {
      const size_t close = text.find(text[0], 1);
      return close != std::string_view::npos && close + 1 < text.size() && text[close + 1] == ':'
                 ? close + 1
                 : std::string_view::npos;
    }
    if (text.starts_with('[') || text.starts_with('{')) return std::string_view::npos;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == ':' && (i + 1 == text.size() || text[i + 1] == ' ')) return i;
    }
    return std::string_view::npos;
  }
  static bool has_key(std::string_view text) { return key_colon(text) != std::string_view::npos; }

  std::pair<std::string, std::string> split_key(const Line& line) const {
    const size_t colon = key_colon(line.text);
    fail_if(colon == std::string::npos, line.number, "'key: value' in a mapping, got '{}'", line.text);
    const std::string_view key = trim_spaces(std::string_view(line.text).substr(0, colon));
    const nlohmann::ordered_json parsed = scalar(key, line.number);
    fail_if(!parsed.is_string(), line.number, "a key that is a name, got '{}'", key);
    return {parsed.get<std::string>(), std::string(trim_spaces(std::string_view(line.text).substr(colon + 1)))};
  }

  nlohmann::ordered_json scalar_or_list(std::string_view text, int line) const {
    if (!text.starts_with('[')) return scalar(text, line);
    fail_if(!text.ends_with(']'), line, "a [a, b] list on one line, got '{}'", text);
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    const std::string_view inner = trim_spaces(text.substr(1, text.size() - 2));
    size_t begin = 0;
    char quote = 0;
    for (size_t i = 0; i <= inner.size() && !inner.empty(); ++i) {
      if (i < inner.size() && quote != 0) {
        if (inner[i] == '\\' && quote == '"')
          ++i;
        else if (inner[i] == quote)
          quote = 0;
      } else if (i < inner.size() && (inner[i] == '"' || inner[i] == '\'')) {
        quote = inner[i];
      } else if (i == inner.size() || inner[i] == ',') {
        const std::string_view item = trim_spaces(inner.substr(begin, i - begin));
        fail_if(item.starts_with('[') || item.starts_with('{'), line, "a list of scalars, got '{}'", text);
        out.push_back(scalar(item, line));
        begin = i + 1;
      }
    }
    return out;
  }

  nlohmann::ordered_json scalar(std::string_view text, int line) const {
    fail_if(text.empty(), line, "a value, got none");
    const char first = text[0];
    fail_if(first == '|' || first == '>', line, "a one-line value, got the block scalar '{}'", text);
    fail_if(first == '{', line, "no flow mapping (quote a Jinja template: \"{{{{x}}}}\"), got '{}'", text);
    fail_if(first == '&' || first == '*' || first == '!', line,
            "no anchors, aliases or tags (lm-eval's !function runs Python, which titan-eval does not: precompute its "
            "result in the data file), got '{}'",
            text);
    if (first == '"') return double_quoted(text, line);
    if (first == '\'') {
      std::string out;
      size_t i = 1;
      for (; i < text.size(); ++i) {
        if (text[i] == '\'') {
          if (i + 1 < text.size() && text[i + 1] == '\'') {
            out += '\'';
            ++i;
          } else {
            break;
          }
        } else {
          out += text[i];
        }
      }
      fail_if(i + 1 != text.size(), line, "one closed single-quoted scalar, got {}", text);
      return out;
    }
    return plain(text);
  }

  nlohmann::ordered_json double_quoted(std::string_view text, int line) const {
    std::string out;
    size_t i = 1;
    for (; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] != '\\') {
        out += text[i];
        continue;
      }
      fail_if(++i == text.size(), line, "an escape after '\\', got the end of {}", text);
      switch (text[i]) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '0':
          out += '\0';
          break;
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case ' ':
          out += ' ';
          break;
        case 'u': {
          uint32_t code = 0;
          const auto [end, ec] =
              std::from_chars(text.data() + i + 1, text.data() + std::min(i + 5, text.size()), code, 16);
          fail_if(ec != std::errc() || end != text.data() + i + 5, line, "\\u and 4 hex digits, got {}", text);
          append_utf8(out, code);
          i += 4;
          break;
        }
        default:
          fail(line, "an escape YAML defines (\\n \\t \\r \\0 \\\" \\\\ \\/ \\u), got '\\{}'", text[i]);
      }
    }
    fail_if(i + 1 != text.size(), line, "one closed double-quoted scalar, got {}", text);
    return out;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  static nlohmann::ordered_json plain(std::string_view text) {
    if (text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    // Numbers start with a digit, a sign or a point; "nan", "inf" and words stay strings.
    if (std::string_view("0123456789+-.").find(text[0]) == std::string_view::npos) return std::string(text);
    int64_t integer = 0;
    const char* end = text.data() + text.size();
    const char* digits = text.data() + (text[0] == '+' ? 1 : 0);
    if (auto [p, ec] = std::from_chars(digits, end, integer); ec == std::errc() && p == end) return integer;
    double number = 0;
    if (auto [p, ec] = std::from_chars(digits, end, number); ec == std::errc() && p == end) return number;
    return std::string(text);
  }

  std::string file_;
  std::vector<Line> lines_;
  size_t next_ = 0;
};

}  // namespace

nlohmann::ordered_json parse_yaml_subset(std::string_view text, const std::string& file) {
  return Parser(text, file).document();
}

}  // namespace titan::eval::detail
