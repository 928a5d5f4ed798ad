// SPDX-License-Identifier: BSD-3-Clause
// Streaming sources: plain/JSONL/.gz/.zst files and globs of shards, exact cursors, the weighted
// mixture, and bad input (malformed JSON, missing field, non-UTF-8, empty shard, unreadable file).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "titan/data/dataloader.hpp"
#include "titan/data/source.hpp"

#include <catch2/catch.hpp>

#include "data_test_util.hpp"
#include "test_util.hpp"

using Catch::Matchers::Contains;
using titan::DatasetFormat;
using titan::OnBadRecord;
using titan::data::CorpusSpec;
using titan::data::DataLoader;
using titan::data::Record;
using titan::data::Source;
namespace fs = std::filesystem;

namespace {

// Every document of one pass, decoded (a bad record skipped by policy is left out).
std::vector<std::string> read_all(Source& source) {
  std::vector<std::string> docs;
  Record r;
  while (source.next(r)) {
    if (auto segments = source.decode(r)) docs.push_back(segments->front().text);
  }
  return docs;
}

void write_jsonl(const fs::path& path, const std::vector<std::string>& docs, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) out += nlohmann::json{{"id", i}, {"text", docs[i]}}.dump() + "\n";
  titan::test::write_file(path, out);
}

// Compresses `in` to `out` (gz or zst); false when no zstd tool is available.
bool compress(const char* kind, const fs::path& in, const fs::path& out) {
  return titan::test::run_python("compress.py", fmt::format("{} \"{}\" \"{}\"", kind, in.string(), out.string())) == 0;
}

std::vector<std::string> shakespeare_documents() {
  return titan::test::read_all_documents(*titan::data::load_dataset("tinyshakespeare", titan::test::tinyshakespeare()));
}

}  // namespace

TEST_CASE("Sources: text JSONL gz zst and a glob of shards read the documents of the indexed corpus", "[data]") {
  titan::test::TempDir tmp;
  const auto docs = shakespeare_documents();
  REQUIRE(docs.size() > 7000);
  write_jsonl(tmp.path / "all.jsonl", docs, 0, docs.size());
  REQUIRE(compress("gz", tmp.path / "all.jsonl", tmp.path / "all.jsonl.gz"));
  const bool zst = compress("zst", tmp.path / "all.jsonl", tmp.path / "all.jsonl.zst");
  if (!zst) WARN("no zstandard module or zstd CLI: .zst not tested");

  auto text = titan::data::open_source("t", {.format = DatasetFormat::text, .path = titan::test::tinyshakespeare()});
  CHECK(read_all(*text) == docs);
  for (const char* name : {"all.jsonl", "all.jsonl.gz", "all.jsonl.zst"}) {
    if (!zst && fs::path(name).extension() == ".zst") continue;
    INFO(name);
    auto source = titan::data::open_source("j", {.format = DatasetFormat::jsonl, .path = tmp.path / name});
    CHECK(read_all(*source) == docs);
  }

  // Three shards, one per compression, read in name order through a glob.
  const fs::path shards = tmp.path / "shards";
  fs::create_directories(shards);
  const size_t third = docs.size() / 3;
  write_jsonl(shards / "part-0.jsonl", docs, 0, third);
  write_jsonl(tmp.path / "p1.jsonl", docs, third, 2 * third);
  write_jsonl(tmp.path / "p2.jsonl", docs, 2 * third, docs.size());
  REQUIRE(compress("gz", tmp.path / "p1.jsonl", shards / "part-1.jsonl.gz"));
  REQUIRE(compress(zst ? "zst" : "gz", tmp.path / "p2.jsonl", shards / (zst ? "part-2.jsonl.zst" : "part-2.jsonl.gz")));
  auto glob = titan::data::open_source("g", {.format = DatasetFormat::jsonl, .path = shards / "part-*"});
  CHECK(read_all(*glob) == docs);
  auto folder = titan::data::open_source("g", {.format = DatasetFormat::jsonl, .path = shards});
  CHECK(read_all(*folder) == docs);

  // The same documents make the same batches, whatever the file format.
  const auto tok = titan::test::tiny_tokenizer();
  DataLoader a({{.source = text, .weight = 1.0}}, tok, {.local_batch_size = 2, .seq_len = 32});
  DataLoader b({{.source = glob, .weight = 1.0}}, tok, {.local_batch_size = 2, .seq_len = 32});
  text->seek({});
  glob->seek({});
  for (int i = 0; i < 5; ++i) CHECK(at::equal(a.next().input, b.next().input));
}

TEST_CASE("Sources: a saved cursor restores the exact next record in plain gz and zst shards", "[data]") {
  titan::test::TempDir tmp;
  const auto docs = shakespeare_documents();
  const size_t half = docs.size() / 2;
  write_jsonl(tmp.path / "a.jsonl", docs, 0, half);
  write_jsonl(tmp.path / "b.jsonl", docs, half, docs.size());
  REQUIRE(compress("gz", tmp.path / "a.jsonl", tmp.path / "s-0.jsonl.gz"));
  if (!compress("zst", tmp.path / "b.jsonl", tmp.path / "s-1.jsonl.zst")) {
    REQUIRE(compress("gz", tmp.path / "b.jsonl", tmp.path / "s-1.jsonl.gz"));
  }
  for (const fs::path& path : {tmp.path / "a.jsonl", tmp.path / "s-*"}) {
    auto source = titan::data::open_source("s", {.format = DatasetFormat::jsonl, .path = path});
    Record r;
    const size_t records = path.filename() == "a.jsonl" ? half : docs.size();
    for (size_t stop : {size_t(0), size_t(1), size_t(37), half - 1, half, half + 5}) {
      if (stop > records) continue;
      source->seek({});
      for (size_t i = 0; i < stop; ++i) REQUIRE(source->next(r));
      const titan::data::SourceCursor cursor = source->cursor();
      auto fresh = titan::data::open_source("s", {.format = DatasetFormat::jsonl, .path = path});
      fresh->seek(cursor);
      INFO(path.string() << " after " << stop << " records");
      const bool more = stop < records;
      REQUIRE(fresh->next(r) == more);
      if (more) CHECK(fresh->decode(r)->front().text == docs[stop]);
    }
  }
}

TEST_CASE("Sources: bad input is reported with file and line or skipped and counted", "[data]") {
  titan::test::TempDir tmp;
  const fs::path dir = tmp.path / "shards";
  fs::create_directories(dir);
  titan::test::write_file(dir / "a-bad.jsonl",
                          "{\"text\": \"one\"}\n"
                          "{\"text\": \"unterminated\"\n"
                          "{\"body\": \"no text field\"}\n"
                          "{\"text\": \"caf\xe9\"}\n"
                          "\n"
                          "{\"text\": \"two\"}\n");
  titan::test::write_file(dir / "b-empty.jsonl", "");
  fs::create_symlink(tmp.path / "nowhere.jsonl", dir / "c-unreadable.jsonl");
  titan::test::write_file(dir / "d-good.jsonl", "{\"text\": \"three\"}\n");

  SECTION("error: each names the file and line") {
    auto source = titan::data::open_source("bad", {.format = DatasetFormat::jsonl, .path = dir / "a-bad.jsonl"});
    Record r;
    REQUIRE(source->next(r));
    CHECK(source->decode(r)->front().text == "one");
    REQUIRE(source->next(r));
    CHECK_THROWS_WITH(source->decode(r), Contains("a-bad.jsonl:2") && Contains("syntax error"));
    REQUIRE(source->next(r));
    CHECK_THROWS_WITH(source->decode(r), Contains("a-bad.jsonl:3") && Contains("\"text\"") && Contains("no such key"));
    REQUIRE(source->next(r));
    CHECK_THROWS_WITH(source->decode(r), Contains("a-bad.jsonl:4") && Contains("UTF-8") && Contains("0xe9"));
    REQUIRE(source->next(r));
    CHECK(r.line == 6);  // the blank line 5 is no record
    CHECK_FALSE(source->next(r));

    auto empty = titan::data::open_source("bad", {.format = DatasetFormat::jsonl, .path = dir / "b-*"});
    CHECK_THROWS_WITH(empty->next(r), Contains("b-empty.jsonl") && Contains("empty"));
    auto unreadable = titan::data::open_source("bad", {.format = DatasetFormat::jsonl, .path = dir / "c-*"});
    CHECK_THROWS_WITH(unreadable->next(r), Contains("c-unreadable.jsonl") && Contains("readable"));

    titan::test::write_file(tmp.path / "latin1.txt", "fine\n\nna\xefve\n");
    auto text = titan::data::open_source("latin1", {.format = DatasetFormat::text, .path = tmp.path / "latin1.txt"});
    REQUIRE(text->next(r));
    REQUIRE(text->next(r));
    CHECK_THROWS_WITH(text->decode(r), Contains("latin1.txt:3") && Contains("UTF-8"));
  }
  SECTION("skip: the good documents remain, every bad one is counted") {
    CorpusSpec spec{.format = DatasetFormat::jsonl, .path = dir / "*.jsonl"};  // a glob lists the broken link
    spec.on_bad_record = OnBadRecord::skip;
    auto source = titan::data::open_source("bad", spec);
    CHECK(read_all(*source) == std::vector<std::string>{"one", "two", "three"});
    CHECK(source->skipped() == 5);  // 3 bad lines, 1 empty shard, 1 unreadable file

    // A training loader over the same shards runs on (looping) and counts the skips.
    DataLoader loader({{.source = titan::data::open_source("bad", spec), .weight = 1.0}}, titan::test::tiny_tokenizer(),
                      {.local_batch_size = 2, .seq_len = 16, .num_workers = 2});
    for (int i = 0; i < 5; ++i) loader.next();
    CHECK(loader.skipped() >= 5);
  }
}

TEST_CASE("Mixture: weighted draws are deterministic and resume with their RNG position", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const auto a_id = tok->encode("A").at(0), b_id = tok->encode("z").at(0);
  auto mixture = [&](uint64_t seed) {
    std::vector<titan::data::WeightedSource> sources{
        {.source = titan::data::corpus_source(titan::data::make_corpus("a", {"A", "A A"})), .weight = 3.0},
        {.source = titan::data::corpus_source(titan::data::make_corpus("b", {"z"})), .weight = 1.0}};
    return DataLoader(std::move(sources), tok, {.local_batch_size = 4, .seq_len = 64, .seed = seed});
  };
  DataLoader m = mixture(7), same = mixture(7), other = mixture(8);
  int64_t a = 0, b = 0;
  bool differs = false;
  for (int i = 0; i < 20; ++i) {
    const auto batch = m.next();
    CHECK(at::equal(batch.input, same.next().input));
    differs |= !at::equal(batch.input, other.next().input);
    a += (batch.input == a_id).sum().item<int64_t>();
    b += (batch.input == b_id).sum().item<int64_t>();
  }
  CHECK(differs);
  // Documents: 3/4 from "a" (1.5 A's each on average), 1/4 from "b": about 4.5 A per z.
  CHECK(double(a) / double(b) == Approx(4.5).epsilon(0.2));

  const auto saved = m.state();
  CHECK(saved.at("stream").at("draws").get<int64_t>() > 0);
  DataLoader resumed = mixture(7);
  resumed.load_state(saved);
  for (int i = 0; i < 20; ++i) CHECK(at::equal(resumed.next().input, m.next().input));
}
