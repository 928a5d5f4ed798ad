// SPDX-License-Identifier: BSD-3-Clause
// BpeTokenizer against Hugging Face `tokenizers` (tests/oracles/hf_tokenizer.py) on all of
// tinyshakespeare plus a line of non-ASCII text, for three kinds of tokenizer.json.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cstring>

#include "data_test_util.hpp"
#include "test_util.hpp"
#include "titan/data/bpe_tokenizer.hpp"
#include "titan/data/pre_tokenizer.hpp"

namespace fs = std::filesystem;
using titan::data::Tokenizer;
using titan::test::TempDir;

namespace {

// Accents, CJK, emoji, digit runs, Unicode numbers, tabs, CRLF, case-folded contractions (incl.
// U+017F, which (?i) folds to 's'), a special token in running text, trailing whitespace.
constexpr std::string_view kExtraLine =
    "Caf\u00e9 na\u00efve fa\u00e7ade \u2014 \u6771\u4eac \u65e5\u672c\u8a9e \U0001F642\U0001F680 12345678 "
    "\u00bd \u216b x\u00b2  tabs\t\there\r\nDON'T 'S '\u017fx <|end_of_text|> end\n   \n";

// The extra line is repeated so that the HF-trained tokenizers learn merges for its digits, CJK and
// emoji; without merges a wrong split of those pieces would give the same byte tokens and go unseen.
fs::path write_corpus(const TempDir& tmp) {
  const fs::path path = tmp.path / "text.txt";
  std::string text = titan::test::read_file(titan::test::tinyshakespeare());
  for (int i = 0; i < 200; ++i) text += kExtraLine;
  titan::test::write_file(path, text);
  return path;
}

std::vector<int32_t> read_ids(const fs::path& path) {
  const std::string bytes = titan::test::read_file(path);
  std::vector<int32_t> ids(bytes.size() / 4);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 4);  // the oracle writes little-endian int32
  return ids;
}

// Runs the oracle's `encode` and checks ids and decoded text against ours.
void check_against_hf(const Tokenizer& tok, const fs::path& tokenizer_json, const fs::path& text, const TempDir& tmp) {
  const fs::path prefix = tmp.path / "hf_encode";
  REQUIRE(titan::test::run_python("hf_tokenizer.py", fmt::format("encode '{}' '{}' '{}'", tokenizer_json.string(),
                                                                 text.string(), prefix.string())) == 0);
  const std::vector<int32_t> hf = read_ids(prefix.string() + ".ids");
  const std::vector<int32_t> ours = tok.encode(titan::test::read_file(text));
  REQUIRE(ours.size() > 100000);
  CHECK(titan::test::first_mismatch(ours, hf, tok) == "");
  CHECK(tok.decode(ours) == titan::test::read_file(prefix.string() + ".decoded"));
}

}  // namespace

TEST_CASE("BpeTokenizer encodes like HF: the tests' tokenizer (2,048 entries, specials after the merges)",
          "[data][full]") {
  TempDir tmp;
  const fs::path dir = titan::test::test_tokenizer();  // made by tests/oracles/make_tokenizer.py
  const auto tok = titan::data::load_tokenizer(dir);
  CHECK(tok->vocab_size() == 2048);
  CHECK(tok->bos_id() == 2040);
  CHECK(tok->eos_id() == 2041);
  CHECK(tok->token_to_id("<|end_of_text|>") == 2041);
  CHECK(tok->token_to_id("<|pad|>") == 2042);
  CHECK(tok->encode("", true, true) == std::vector<int32_t>{2040, 2041});
  // Real merges: common words are one token, with the space before them.
  REQUIRE(tok->token_to_id("\u0120the").has_value());
  CHECK(tok->encode(" the") == std::vector<int32_t>{*tok->token_to_id("\u0120the")});
  check_against_hf(*tok, dir / "tokenizer.json", write_corpus(tmp), tmp);
}

TEST_CASE("BpeTokenizer encodes like HF: HF-trained GPT-2 style BPE with merges", "[data][full]") {
  TempDir tmp;
  const fs::path text = write_corpus(tmp), dir = tmp.path / "gpt2";
  REQUIRE(titan::test::run_python("hf_tokenizer.py",
                                  fmt::format("train '{}' 1500 '{}'", text.string(), dir.string())) == 0);
  const auto tok = titan::data::load_tokenizer(dir);
  CHECK(tok->vocab_size() == 1500);
  CHECK(tok->bos_id() == 0);
  CHECK(tok->eos_id() == 1);
  const std::vector<int32_t> hf = read_ids(dir / "hf.ids");
  const std::vector<int32_t> ours = tok->encode(titan::test::read_file(text));
  CHECK(titan::test::first_mismatch(ours, hf, *tok) == "");
  CHECK(tok->decode(ours) == titan::test::read_file(dir / "hf.decoded"));
  // Checked by hand with tokenizers 0.23: the prefix space goes to each segment between special
  // tokens, and an empty text gives no tokens at all.
  CHECK(tok->encode("").empty());
  REQUIRE(tok->token_to_id("\u0120b").has_value());
  CHECK(tok->encode("<|end_of_text|><|end_of_text|>b") == std::vector<int32_t>{1, 1, *tok->token_to_id("\u0120b")});
}

TEST_CASE("BpeTokenizer encodes like HF: Llama 3 split regex, ignore_merges, BOS from the template", "[data][full]") {
  TempDir tmp;
  const fs::path text = write_corpus(tmp), dir = tmp.path / "llama3";
  REQUIRE(titan::test::run_python("hf_tokenizer.py",
                                  fmt::format("llama3 '{}' 1500 '{}'", text.string(), dir.string())) == 0);
  const auto tok = titan::data::BpeTokenizer::from_files(dir / "tokenizer.json", dir / "tokenizer_config.json");
  CHECK(tok->post_processor_adds_bos());
  CHECK_FALSE(tok->post_processor_adds_eos());
  const std::string corpus = titan::test::read_file(text);
  const std::vector<int32_t> hf = read_ids(dir / "hf.ids");
  const std::vector<int32_t> ours = tok->encode(corpus);
  CHECK(titan::test::first_mismatch(ours, hf, *tok) == "");
  CHECK(tok->decode(ours) == titan::test::read_file(dir / "hf.decoded"));
  std::string without_specials = corpus;
  for (size_t at; (at = without_specials.find("<|end_of_text|>")) != std::string::npos;) without_specials.erase(at, 15);
  CHECK(tok->decode(ours, /*skip_special_tokens=*/true) == without_specials);

  // torchtitan's rule: the template's BOS is not added again; EOS is appended once.
  const std::vector<int32_t> doc = tok->encode("Hello world", true, true);
  REQUIRE(doc.size() >= 3);
  CHECK(doc.front() == *tok->bos_id());
  CHECK(doc[1] != *tok->bos_id());
  CHECK(doc.back() == *tok->eos_id());
}

TEST_CASE("Scanners split like HF's GPT-2 and Llama 3 regexes", "[data]") {
  using titan::data::SplitPattern;
  auto split = [](std::string_view text, SplitPattern p) {
    std::vector<std::string_view> views;
    titan::data::split_pieces(text, p, views);
    return std::vector<std::string>(views.begin(), views.end());
  };
  using V = std::vector<std::string>;
  // Expected pieces were produced by tokenizers 0.23 (pre_tokenize_str).
  CHECK(split("a  b", SplitPattern::gpt2) == V{"a", " ", " b"});
  CHECK(split("a\t\tb", SplitPattern::gpt2) == V{"a", "\t", "\t", "b"});
  CHECK(split("a\t\tb", SplitPattern::llama3) == V{"a", "\t", "\tb"});
  CHECK(split("a\n\nb", SplitPattern::llama3) == V{"a", "\n\n", "b"});
  CHECK(split("x \n  y", SplitPattern::llama3) == V{"x", " \n", " ", " y"});
  CHECK(split("don'T 'S 'ſx", SplitPattern::llama3) == V{"don", "'T", " '", "S", " '", "ſx"});
  CHECK(split("'ſx", SplitPattern::llama3) == V{"'ſ", "x"});
  CHECK(split("don'T 'S", SplitPattern::gpt2) == V{"don", "'", "T", " '", "S"});
  CHECK(split("12345 x\u00b2", SplitPattern::llama3) == V{"123", "45", " x", "\u00b2"});
  CHECK(split("12345 x\u00b2", SplitPattern::gpt2) == V{"12345", " x", "\u00b2"});
  CHECK(split("end   ", SplitPattern::gpt2) == V{"end", "   "});
  CHECK(split("a\u3000\u3000b", SplitPattern::gpt2) == V{"a", "\u3000", "\u3000", "b"});
  CHECK(split("a\x1c\x1c b", SplitPattern::gpt2) == V{"a", "\x1c\x1c", " b"});
  CHECK(split("!!\r\n\r\nx", SplitPattern::llama3) == V{"!!\r\n\r\n", "x"});
}

TEST_CASE("Byte-level alphabet is GPT-2's bytes_to_unicode", "[data]") {
  CHECK(titan::data::byte_to_char(' ') == U'\u0120');   // 'Ġ'
  CHECK(titan::data::byte_to_char('\n') == U'\u010a');  // 'Ċ'
  CHECK(titan::data::byte_to_char('A') == U'A');
  CHECK(titan::data::byte_to_char(0xAD) == U'\u0143');
  for (int b = 0; b < 256; ++b) CHECK(titan::data::char_to_byte(titan::data::byte_to_char(uint8_t(b))) == uint8_t(b));
  CHECK(titan::data::from_byte_level(titan::data::to_byte_level("h\xC3\xA9llo\n")) == "h\xC3\xA9llo\n");
  CHECK_FALSE(titan::data::from_byte_level("a b").has_value());  // a raw space is not in the alphabet
}
