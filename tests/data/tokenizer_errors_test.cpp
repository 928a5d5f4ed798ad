// SPDX-License-Identifier: BSD-3-Clause
// Corrupt or unsupported tokenizer files fail with errors that name the file and the key.
#include <c10/util/Exception.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "titan/data/bpe_tokenizer.hpp"
#include "titan/data/pre_tokenizer.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using nlohmann::json;
using titan::test::TempDir;

namespace {

// A valid byte-level BPE: the 256 bytes, "Ġt" and "Ġth" by two merges.
json minimal_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[titan::data::to_byte_level(std::string(1, char(b)))] = b;
  vocab["\u0120t"] = 256;
  vocab["\u0120th"] = 257;
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  return {{"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"added_tokens", json::array()},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\u0120 t", json::array({"\u0120t", "h"})}}}}};
}

fs::path write(const TempDir& tmp, const std::string& text) {
  const fs::path path = tmp.path / "tokenizer.json";
  titan::test::write_file(path, text);
  return path;
}

}  // namespace

TEST_CASE("BpeTokenizer: a minimal tokenizer.json with both merge spellings loads", "[data]") {
  TempDir tmp;
  const auto tok = titan::data::load_tokenizer(write(tmp, minimal_tokenizer().dump()));
  CHECK(tok->encode(" the") == std::vector<int32_t>{257, 'e'});
  CHECK(tok->vocab_size() == 258);
  CHECK_FALSE(tok->bos_id().has_value());
  CHECK(tok->encode("x", true, true) == std::vector<int32_t>{'x'});  // nothing to add without BOS/EOS

  // Decoding partial characters gives U+FFFD per maximal invalid subsequence, as Python's
  // bytes.decode("utf-8", "replace") and HF do.
  using Ids = std::vector<int32_t>;
  const std::string fffd = "\uFFFD";
  CHECK(tok->decode(Ids{0xE6}) == fffd);
  CHECK(tok->decode(Ids{0xE6, 0x9D, 'a'}) == fffd + "a");
  CHECK(tok->decode(Ids{0xC0, 0x80}) == fffd + fffd);
  CHECK(tok->decode(Ids{0xED, 0xA0, 0x80}) == fffd + fffd + fffd);
  CHECK(tok->decode(Ids{0xF4, 0x90, 0x80, 0x80}) == fffd + fffd + fffd + fffd);
  CHECK(tok->decode(Ids{0xF0, 0x9F, 0x99, 0x82, 999, -1}) == "\U0001F642");  // unknown ids are skipped
}

TEST_CASE("BpeTokenizer: corrupt tokenizer.json files are refused, naming the file", "[data]") {
  TempDir tmp;
  const std::string good = minimal_tokenizer().dump();

  SECTION("truncated JSON names the byte") {
    const fs::path path = write(tmp, good.substr(0, good.size() / 2));
    CHECK_THROWS_WITH(titan::data::load_tokenizer(path), Contains(path.string()) && Contains("syntax error at byte"));
  }
  SECTION("wrong model type") {
    json doc = minimal_tokenizer();
    doc["model"]["type"] = "WordPiece";
    const fs::path path = write(tmp, doc.dump());
    CHECK_THROWS_AS(titan::data::load_tokenizer(path), c10::ValueError);
    CHECK_THROWS_WITH(titan::data::load_tokenizer(path),
                      Contains(path.string()) && Contains("\"model.type\"") && Contains("\"WordPiece\""));
  }
  SECTION("merges referencing unknown tokens") {
    json doc = minimal_tokenizer();
    doc["model"]["merges"].push_back("\u0120th zz");
    const fs::path path = write(tmp, doc.dump());
    CHECK_THROWS_WITH(titan::data::load_tokenizer(path),
                      Contains(path.string()) && Contains("model.merges[2]") && Contains("\"zz\" is not"));
  }
  SECTION("missing vocab") {
    json doc = minimal_tokenizer();
    doc["model"].erase("vocab");
    CHECK_THROWS_WITH(titan::data::load_tokenizer(write(tmp, doc.dump())), Contains("\"model.vocab\""));
  }
  SECTION("a split regex we have no scanner for") {
    json doc = minimal_tokenizer();
    doc["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers",
                             {{{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}}, {"behavior", "Isolated"}},
                              {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    CHECK_THROWS_AS(titan::data::load_tokenizer(write(tmp, doc.dump())), c10::NotImplementedError);
    CHECK_THROWS_WITH(titan::data::load_tokenizer(write(tmp, doc.dump())),
                      Contains("pre_tokenizer.pretokenizers[0].pattern") && Contains("Llama 3"));
  }
  SECTION("a BOS in tokenizer_config.json that is no token is named with the config's path") {
    write(tmp, good);
    titan::test::write_file(tmp.path / "tokenizer_config.json", R"({"bos_token": {"content": ""}})");
    CHECK_THROWS_WITH(titan::data::load_tokenizer(tmp.path),
                      Contains("tokenizer_config.json") && Contains("\"bos_token\""));
  }
  SECTION("no tokenizer.json at all") {
    CHECK_THROWS_WITH(titan::data::load_tokenizer(tmp.path / "absent"),
                      Contains((tmp.path / "absent" / "tokenizer.json").string()) || Contains("absent"));
    CHECK_THROWS_WITH(titan::data::load_tokenizer(tmp.path), Contains("tokenizer.json") && Contains("hf_assets_path"));
  }
}
