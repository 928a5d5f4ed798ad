// SPDX-License-Identifier: BSD-3-Clause
// Corpus formats (text, JSON Lines, fortunes), the dataset registry and its errors.
#include <catch2/catch.hpp>

#include "test_util.hpp"
#include "titan/data/corpus.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using titan::DatasetFormat;
using titan::test::TempDir;

namespace {

std::vector<std::string> all_documents(const titan::data::Corpus& c) {
  std::vector<std::string> docs;
  for (int64_t i = 0; i < c.size(); ++i) docs.push_back(c.document(i));
  return docs;
}

}  // namespace

TEST_CASE("Corpus: plain text splits on blank lines, or one document per file", "[data]") {
  TempDir tmp;
  titan::test::write_file(tmp.path / "a.txt", "First:\nline two\n\n \t\nSecond\r\n\n\n\nThird\n");
  titan::test::write_file(tmp.path / "b.txt", "Fourth (no final newline)");
  const auto blocks = titan::data::open_corpus("t", {.format = DatasetFormat::text, .path = tmp.path});
  CHECK(all_documents(*blocks) ==
        std::vector<std::string>{"First:\nline two", "Second\r", "Third", "Fourth (no final newline)"});
  CHECK(blocks->files().size() == 2);
  CHECK(blocks->files()[0].second == 37);

  const auto files = titan::data::open_corpus(
      "t", {.format = DatasetFormat::text, .path = tmp.path / "a.txt", .split_blank_lines = false});
  CHECK(all_documents(*files) == std::vector<std::string>{titan::test::read_file(tmp.path / "a.txt")});
}

TEST_CASE("Corpus: JSON Lines with a configurable text field and bad lines named", "[data]") {
  TempDir tmp;
  titan::test::write_file(tmp.path / "d.jsonl",
                          "{\"text\": \"one\", \"body\": \"x\"}\n\n{\"text\": \"two\\nlines\"}\n"
                          "{\"body\": \"y\"}\n{broken\n");
  titan::test::write_file(tmp.path / "ignored.txt", "not json");
  const auto c = titan::data::open_corpus("j", {.format = DatasetFormat::jsonl, .path = tmp.path});
  REQUIRE(c->size() == 4);
  CHECK(c->document(0) == "one");
  CHECK(c->document(1) == "two\nlines");
  CHECK_THROWS_WITH(c->document(2), Contains("d.jsonl:4") && Contains("\"text\""));
  CHECK_THROWS_WITH(c->document(3), Contains("d.jsonl:5") && Contains("syntax error"));
  CHECK_THROWS_WITH(c->document(4), Contains("[0, 4)"));
  const auto body = titan::data::open_corpus(
      "j", {.format = DatasetFormat::jsonl, .path = tmp.path / "d.jsonl", .text_field = "body"});
  CHECK(body->document(0) == "x");
}

TEST_CASE("Corpus: fortunes files, skipping .dat, .u8 and off/", "[data]") {
  TempDir tmp;
  titan::test::write_file(tmp.path / "wisdom", "Quote one.\n%\nQuote two\n  -- someone\n%\n%\nLast quote.\n");
  titan::test::write_file(tmp.path / "wisdom.dat", "binary index");
  fs::create_symlink(tmp.path / "wisdom", tmp.path / "wisdom.u8");
  fs::create_directories(tmp.path / "off");
  titan::test::write_file(tmp.path / "off" / "rude", "Ebg13 grkg.\n%\n");
  const auto c = titan::data::open_corpus("f", {.format = DatasetFormat::fortunes, .path = tmp.path});
  CHECK(all_documents(*c) == std::vector<std::string>{"Quote one.", "Quote two\n  -- someone", "Last quote."});
  CHECK(c->files().size() == 1);
}

TEST_CASE("Datasets: fortunes from Debian, as the project's default data", "[data]") {
  // scripts/setup.sh installs Debian's fortunes: the default corpus must be there.
  REQUIRE(fs::exists("/usr/share/games/fortunes/fortunes"));
  const auto c = titan::data::load_dataset("fortunes");
  CHECK(c->size() > 5000);
  CHECK(c->name() == "fortunes");
  for (int64_t i = 0; i < c->size(); i += 97) {
    const std::string doc = c->document(i);
    CHECK_FALSE(doc.empty());
    CHECK(doc.find("\n%\n") == std::string::npos);
  }
}

TEST_CASE("Datasets: registry, dataset_path, and errors naming dataset and path", "[data]") {
  TempDir tmp;
  const auto names = titan::data::registered_datasets();
  CHECK(std::find(names.begin(), names.end(), "fortunes") != names.end());
  CHECK_THROWS_WITH(titan::data::load_dataset("tinyshakespeare"),
                    Contains("\"tinyshakespeare\"") && Contains("dataset_path"));
  CHECK_THROWS_WITH(titan::data::load_dataset("c4"), Contains("\"c4\"") && Contains("allenai/c4"));
  CHECK_THROWS_WITH(titan::data::load_dataset("c5"),
                    Contains("\"c5\"") && Contains("fortunes") && Contains("register_dataset"));
  const fs::path missing = tmp.path / "nowhere";
  CHECK_THROWS_WITH(titan::data::load_dataset("fortunes", missing),
                    Contains(missing.string()) && Contains("apt-get install fortunes"));

  titan::test::write_file(tmp.path / "empty.txt", "\n\n  \n");
  CHECK_THROWS_WITH(titan::data::load_dataset("tinyshakespeare", tmp.path / "empty.txt"),
                    Contains("at least one document") && Contains("empty.txt"));
  CHECK_THROWS_WITH(titan::data::make_corpus("m", {}), Contains("at least one document"));

  titan::test::write_file(tmp.path / "mine.jsonl", "{\"content\": \"hello\"}\n");
  titan::data::register_dataset(
      "mine", {.format = DatasetFormat::jsonl, .path = tmp.path / "mine.jsonl", .text_field = "content"});
  CHECK(titan::data::load_dataset("mine")->document(0) == "hello");

  const auto shakespeare = titan::data::load_dataset("tinyshakespeare", titan::test::tinyshakespeare());
  CHECK(shakespeare->size() > 7000);
  CHECK(shakespeare->document(0) == "First Citizen:\nBefore we proceed any further, hear me speak.");
}
