// SPDX-License-Identifier: BSD-3-Clause
// BpeTrainer: the tokenizer.json it writes loads in HF `tokenizers` and encodes like our encoder.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cstring>

#include "data_test_util.hpp"
#include "test_util.hpp"
#include "titan/data/bpe_trainer.hpp"

namespace fs = std::filesystem;
using titan::test::TempDir;

namespace {

std::vector<int32_t> hf_encode(const fs::path& dir, const fs::path& text, const TempDir& tmp) {
  const fs::path prefix = tmp.path / "hf";
  REQUIRE(
      titan::test::run_python("hf_tokenizer.py", fmt::format("encode '{}' '{}' '{}'", (dir / "tokenizer.json").string(),
                                                             text.string(), prefix.string())) == 0);
  const std::string bytes = titan::test::read_file(prefix.string() + ".ids");
  std::vector<int32_t> ids(bytes.size() / 4);
  std::memcpy(ids.data(), bytes.data(), ids.size() * 4);
  return ids;
}

titan::data::TrainedBpe train_on(std::string_view text, titan::data::BpeTrainerConfig config) {
  titan::data::BpeTrainer trainer(std::move(config));
  trainer.add_text(text);
  return trainer.train();
}

}  // namespace

TEST_CASE("BpeTrainer: HF loads the trained tokenizer.json and encodes tinyshakespeare identically", "[data]") {
  TempDir tmp;
  const fs::path text_path = titan::test::tinyshakespeare();
  const std::string text = titan::test::read_file(text_path);
  const titan::data::TrainedBpe bpe = train_on(text, {.vocab_size = 2048});
  CHECK(bpe.vocab.size() == 2048);
  CHECK(bpe.merges.size() >= 2048 - 256 - 3);
  bpe.save(tmp.path / "tok");
  const auto tok = titan::data::load_tokenizer(tmp.path / "tok");
  CHECK(tok->vocab_size() == 2048);
  CHECK(tok->bos_id() == 2045);
  CHECK(tok->eos_id() == 2046);
  CHECK(tok->token_to_id("<|pad|>") == 2047);
  const std::vector<int32_t> ours = tok->encode(text);
  CHECK(ours.size() < text.size() / 2);  // merges were learnt and used (no merges: one token per byte)
  CHECK(titan::test::first_mismatch(ours, hf_encode(tmp.path / "tok", text_path, tmp), *tok) == "");
  CHECK(tok->decode(ours) == text);
}

TEST_CASE("BpeTrainer: the Llama 3 split variant also matches HF", "[data]") {
  TempDir tmp;
  const std::string text = titan::test::read_file(titan::test::tinyshakespeare()).substr(0, 200000) +
                           "\nNumbers 1234567 and \u6771\u4eac\u00e9\n";
  const fs::path text_path = tmp.path / "text.txt";
  titan::test::write_file(text_path, text);
  const auto bpe = train_on(text, {.vocab_size = 600, .split = titan::data::SplitPattern::llama3});
  bpe.save(tmp.path / "tok");
  const auto tok = titan::data::load_tokenizer(tmp.path / "tok");
  const std::vector<int32_t> ours = tok->encode(text);
  CHECK(titan::test::first_mismatch(ours, hf_encode(tmp.path / "tok", text_path, tmp), *tok) == "");
  CHECK(tok->decode(ours) == text);
}

TEST_CASE("BpeTrainer is deterministic and independent of document order", "[data]") {
  const auto docs = titan::test::sample_documents();
  auto train = [&](bool reversed) {
    titan::data::BpeTrainer trainer({.vocab_size = 320});
    for (size_t i = 0; i < docs.size(); ++i) trainer.add_text(docs[reversed ? docs.size() - 1 - i : i]);
    return trainer.train();
  };
  const auto a = train(false), b = train(true);
  CHECK(a.merges.size() > 20);
  CHECK(a.merges == b.merges);
  CHECK(a.vocab == b.vocab);
}

TEST_CASE("BpeTrainer: small text gives a smaller vocab and bad settings are refused", "[data]") {
  const auto bpe = train_on("abab", {.vocab_size = 1000});
  CHECK(bpe.vocab.size() < 1000);
  CHECK(bpe.vocab.size() == 256 + 2 + 3);  // "ab", "abab", then the specials
  CHECK(bpe.tokenizer()->encode("abab") == std::vector<int32_t>{257});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(titan::data::BpeTrainer({.vocab_size = 100}),
                    Contains("vocab_size >= 256 bytes + 3 special tokens"));
  CHECK_THROWS_WITH(titan::data::BpeTrainer({.bos_token = "<s>"}), Contains("\"<s>\""));
}
