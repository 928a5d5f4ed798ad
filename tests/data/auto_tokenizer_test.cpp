// SPDX-License-Identifier: BSD-3-Clause
// tokenizer_for: uses hf_assets_path's tokenizer.json, else trains once on the corpus and caches.
#include <catch2/catch.hpp>

#include "data_test_util.hpp"
#include "test_util.hpp"
#include "titan/data/auto_tokenizer.hpp"

namespace fs = std::filesystem;
using titan::test::TempDir;

namespace {

std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("tokenizer_for trains a BPE on first use, caches it, and reuses it", "[data]") {
  TempDir tmp;
  titan::test::write_file(tmp.path / "corpus.txt", "Hello there, general.\n\nHello again and again.\n\nThe end.\n");
  const auto corpus = titan::data::open_corpus("greetings", {.path = tmp.path / "corpus.txt"});
  const fs::path cache = tmp.path / "cache";

  const auto first = titan::data::tokenizer_for("", *corpus, 400, cache);
  REQUIRE(entries(cache).size() == 1);
  const fs::path dir = entries(cache)[0];
  CHECK(dir.filename().string().starts_with("greetings-v400-"));
  CHECK(fs::exists(dir / "tokenizer.json"));
  CHECK(fs::exists(dir / "tokenizer_config.json"));
  CHECK(first->vocab_size() < 400);  // the text runs out of pairs
  CHECK(first->decode(first->encode("Hello again")) == "Hello again");
  const auto written = fs::last_write_time(dir / "tokenizer.json");

  const auto again = titan::data::tokenizer_for(tmp.path / "no-assets-here", *corpus, 400, cache);
  CHECK(entries(cache).size() == 1);
  CHECK(fs::last_write_time(dir / "tokenizer.json") == written);
  CHECK(again->encode("Hello there") == first->encode("Hello there"));

  // A changed corpus (other size) or another vocab size is another cache entry.
  titan::test::write_file(tmp.path / "corpus.txt", "Different text now.\n");
  const auto changed = titan::data::open_corpus("greetings", {.path = tmp.path / "corpus.txt"});
  titan::data::tokenizer_for("", *changed, 400, cache);
  titan::data::tokenizer_for("", *changed, 270, cache);
  CHECK(entries(cache).size() == 3);
}

TEST_CASE("tokenizer_for prefers the tokenizer.json in hf_assets_path", "[data]") {
  TempDir tmp;
  const auto corpus = titan::data::make_corpus("sample", titan::test::sample_documents());
  const auto tok = titan::data::tokenizer_for(titan::test::test_tokenizer(), *corpus, 4096, tmp.path / "cache");
  CHECK(tok->vocab_size() == 2048);
  CHECK_FALSE(fs::exists(tmp.path / "cache"));
}
