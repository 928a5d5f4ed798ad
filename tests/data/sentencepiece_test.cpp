// SPDX-License-Identifier: BSD-3-Clause
// Sentencepiece: a model trained with libsentencepiece encodes all of tinyshakespeare exactly as the
// Python sentencepiece package does, and loads through load_tokenizer.
#include "titan/data/sentencepiece_tokenizer.hpp"

#include <catch2/catch.hpp>

#include <sstream>

#include "data_test_util.hpp"
#include "test_util.hpp"

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

TEST_CASE("Sentencepiece: ids equal the Python package's on the whole of tinyshakespeare", "[data][full]") {
  titan::test::TempDir tmp;
  const fs::path text = titan::test::tinyshakespeare();
  const fs::path model =
      titan::data::train_sentencepiece({text}, tmp.path / "sp", {.vocab_size = 1000, .model_type = "bpe"});
  REQUIRE(fs::exists(model));
  const auto tok = titan::data::load_sentencepiece(model);
  CHECK(tok->vocab_size() == 1000);
  REQUIRE(tok->bos_id().has_value());
  REQUIRE(tok->eos_id().has_value());

  REQUIRE(titan::test::run_python("sentencepiece_encode.py",
                                  fmt::format("\"{}\" \"{}\" \"{}\"", model.string(), text.string(),
                                              (tmp.path / "ids.txt").string())) == 0);
  std::vector<int32_t> expected;
  std::istringstream in(titan::test::read_file(tmp.path / "ids.txt"));
  for (int32_t id; in >> id;) expected.push_back(id);
  const std::string content = titan::test::read_file(text);
  const auto ours = tok->encode(content);
  REQUIRE(expected.size() > 100000);
  CHECK(titan::test::first_mismatch(ours, expected, *tok).empty());
  // The default normalizer (nmt_nfkc) folds newlines into spaces, so only single lines round-trip.
  CHECK(tok->decode(tok->encode("To be, or not to be: that is the question.")) ==
        "To be, or not to be: that is the question.");

  const auto framed = tok->encode("hello", true, true);
  CHECK(framed.front() == *tok->bos_id());
  CHECK(framed.back() == *tok->eos_id());
  // A folder with tokenizer.model (and no tokenizer.json) loads as sentencepiece too.
  fs::copy_file(model, tmp.path / "tokenizer.model");
  CHECK(titan::data::load_tokenizer(tmp.path)->encode("To be, or not") == tok->encode("To be, or not"));
  CHECK_THROWS_WITH(titan::data::load_sentencepiece(tmp.path / "none.model"), Contains("none.model"));
  titan::test::write_file(tmp.path / "bad.model", "not a model");
  CHECK_THROWS_WITH(titan::data::load_sentencepiece(tmp.path / "bad.model"), Contains("bad.model"));
}
