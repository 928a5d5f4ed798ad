// SPDX-License-Identifier: BSD-3-Clause
// Packing (torchtitan v0.2's windows of seq_len + 1), the layout-invariant data-parallel split,
// exact resume (also under another dp degree) and worker-count independence.
// ATen before Catch: c10's logging defines a CHECK macro that Catch's must replace.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "titan/data/dataloader.hpp"
#include "titan/nn/loss.hpp"

#include <catch2/catch.hpp>

#include "data_test_util.hpp"
#include "test_util.hpp"

using Catch::Matchers::Contains;
using titan::data::Batch;
using titan::data::DataLoader;
using titan::data::DataLoaderOptions;

namespace {

// The global token stream as torchtitan builds it: every document with BOS and EOS, looped.
std::vector<int32_t> expected_stream(const titan::data::Corpus& corpus, const titan::data::Tokenizer& tok,
                                     size_t min_tokens) {
  std::vector<int32_t> stream;
  for (int64_t i = 0; stream.size() < min_tokens; i = (i + 1) % corpus.size()) {
    const auto ids = tok.encode(corpus.document(i), true, true);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  return stream;
}

std::vector<int64_t> row(const at::Tensor& t, int64_t b) {
  const at::Tensor r = t[b].contiguous();
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

std::vector<int64_t> window_part(const std::vector<int32_t>& stream, int64_t w, int64_t S, int64_t shift) {
  const auto* start = stream.data() + w * (S + 1) + shift;
  return {start, start + S};
}

// A loader over tinyshakespeare (one document per speech); each loader opens its own source.
DataLoader shakespeare_loader(const std::shared_ptr<const titan::data::Tokenizer>& tok, DataLoaderOptions config) {
  auto source = titan::data::open_source(
      "tinyshakespeare", {.format = titan::DatasetFormat::text, .path = titan::test::tinyshakespeare()});
  return DataLoader({{.source = std::move(source), .weight = 1.0}}, tok, config);
}

// The rows of one global batch as one loader sees them: its grad_accum_steps microbatches, stacked.
at::Tensor next_rows(DataLoader& loader, bool labels = false) {
  std::vector<at::Tensor> parts;
  for (int64_t m = 0; m < loader.config().grad_accum_steps; ++m) {
    Batch b = loader.next();
    parts.push_back(labels ? b.labels : b.input);
  }
  return at::cat(parts);
}

}  // namespace

TEST_CASE("DataLoader packs documents with BOS/EOS into windows of seq_len + 1", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const auto corpus = titan::data::make_corpus("sample", titan::test::sample_documents());
  const int64_t B = 3, S = 16;
  DataLoader loader(corpus, tok, {.local_batch_size = B, .seq_len = S});
  const auto stream = expected_stream(*corpus, *tok, 10 * B * (S + 1));
  for (int64_t step = 0; step < 8; ++step) {
    const auto batch = loader.next();
    REQUIRE(batch.input.sizes() == at::IntArrayRef{B, S});
    REQUIRE(batch.labels.sizes() == at::IntArrayRef{B, S});
    CHECK(batch.input.scalar_type() == at::kLong);
    CHECK_FALSE(batch.positions.defined());  // concat packing: plain causal attention
    for (int64_t b = 0; b < B; ++b) {
      const int64_t w = step * B + b;
      CHECK(row(batch.input, b) == window_part(stream, w, S, 0));
      CHECK(row(batch.labels, b) == window_part(stream, w, S, 1));
    }
    CHECK(at::equal(batch.input.slice(1, 1), batch.labels.slice(1, 0, S - 1)));
  }
  CHECK(loader.epoch() >= 1);  // the 6 sample documents are far fewer than 8 * 3 * 17 tokens
  const auto empty_doc = tok->encode("", true, true);
  CHECK(empty_doc == std::vector<int32_t>{*tok->bos_id(), *tok->eos_id()});
}

TEST_CASE("DataLoader: dp 1 2 4 x accumulation 1 2 see the samples of one rank with the whole batch", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const int64_t G = 8, S = 24, steps = 4;
  DataLoader whole = shakespeare_loader(tok, {.local_batch_size = G, .seq_len = S});
  std::vector<at::Tensor> reference, reference_labels;
  for (int64_t k = 0; k < steps; ++k) {
    const Batch b = whole.next();
    reference.push_back(b.input);
    reference_labels.push_back(b.labels);
  }
  // The reference is the packed stream itself: consecutive windows, labels shifted by one.
  CHECK(at::equal(reference[0][1][0], reference_labels[0][0][S - 1]) == false);
  for (int64_t N : {1, 2, 4}) {
    for (int64_t A : {1, 2}) {
      for (int64_t r = 0; r < N; ++r) {
        DataLoader loader = shakespeare_loader(
            tok, {.local_batch_size = G / (N * A), .seq_len = S, .dp_rank = r, .dp_degree = N, .grad_accum_steps = A});
        REQUIRE(loader.global_batch_size() == G);
        for (int64_t k = 0; k < steps; ++k) {
          INFO("dp " << N << " accumulation " << A << " rank " << r << " global batch " << k);
          // Rank r's slice of global batch k: rows [r*G/N, (r+1)*G/N), in order.
          CHECK(at::equal(next_rows(loader), reference[size_t(k)].slice(0, r * G / N, (r + 1) * G / N)));
        }
      }
    }
  }
}

TEST_CASE("DataLoader state: next 50 batches identical after restore and after dp 4 -> dp 2", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const int64_t G = 4, S = 33, k = 7, n = 50;
  DataLoader first = shakespeare_loader(tok, {.local_batch_size = G, .seq_len = S});
  for (int64_t i = 0; i < k; ++i) first.next();
  const std::string saved = first.state().dump();
  CHECK(saved.size() < 2000);  // position + carried tokens, never the data
  std::vector<Batch> expected;
  for (int64_t i = 0; i < n; ++i) expected.push_back(first.next());

  SECTION("same layout, with and without workers") {
    for (int64_t workers : {0, 2}) {
      DataLoader resumed = shakespeare_loader(tok, {.local_batch_size = G, .seq_len = S, .num_workers = workers});
      resumed.load_state(nlohmann::json::parse(saved));
      for (int64_t i = 0; i < n; ++i) {
        const Batch b = resumed.next();
        INFO("workers " << workers << " batch " << i);
        REQUIRE(at::equal(b.input, expected[size_t(i)].input));
        REQUIRE(at::equal(b.labels, expected[size_t(i)].labels));
      }
    }
  }
  SECTION("saved at dp 4, restored at dp 2 with accumulation 2: the global stream continues") {
    std::vector<std::string> states;
    for (int64_t r = 0; r < 4; ++r) {
      DataLoader rank = shakespeare_loader(tok, {.local_batch_size = 1, .seq_len = S, .dp_rank = r, .dp_degree = 4});
      for (int64_t i = 0; i < k; ++i) rank.next();
      states.push_back(rank.state().dump());
    }
    // Every rank's state is the same: each walked the whole global stream.
    for (const auto& s : states) CHECK(s == saved);
    for (int64_t r = 0; r < 2; ++r) {
      DataLoader rank = shakespeare_loader(
          tok, {.local_batch_size = 1, .seq_len = S, .dp_rank = r, .dp_degree = 2, .grad_accum_steps = 2});
      rank.load_state(nlohmann::json::parse(states[size_t(3 - r)]));
      for (int64_t i = 0; i < n; ++i) {
        INFO("rank " << r << " batch " << i);
        REQUIRE(at::equal(next_rows(rank), expected[size_t(i)].input.slice(0, 2 * r, 2 * r + 2)));
      }
    }
  }
  SECTION("a state taken inside a step restores under the same layout only") {
    const DataLoaderOptions split{.local_batch_size = 2, .seq_len = S, .grad_accum_steps = 2};
    DataLoader a = shakespeare_loader(tok, split);
    a.load_state(nlohmann::json::parse(saved));
    a.next();
    const auto mid = a.state();
    CHECK(mid.at("microbatch") == 1);
    const Batch second_half = a.next();
    CHECK(at::equal(second_half.input, expected[0].input.slice(0, 2, 4)));
    DataLoader b = shakespeare_loader(tok, split);
    b.load_state(mid);
    CHECK(at::equal(b.next().input, second_half.input));
    DataLoader other = shakespeare_loader(tok, {.local_batch_size = 4, .seq_len = S});
    CHECK_THROWS_WITH(other.load_state(mid), Contains("step boundary"));
  }
  SECTION("a state for another dataset or seq_len is refused") {
    auto other = titan::data::make_corpus("other", titan::test::sample_documents());
    DataLoader wrong(other, tok, {.local_batch_size = G, .seq_len = S});
    CHECK_THROWS_WITH(wrong.load_state(nlohmann::json::parse(saved)), Contains("\"tinyshakespeare\""));
    DataLoader longer = shakespeare_loader(tok, {.local_batch_size = G, .seq_len = S + 1});
    CHECK_THROWS_WITH(longer.load_state(nlohmann::json::parse(saved)), Contains("seq_len"));
  }
}

TEST_CASE("DataLoader: output does not depend on the number of tokenizer workers", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const DataLoaderOptions base{.local_batch_size = 4, .seq_len = 64, .prefetch = 3};
  DataLoader inline_loader = shakespeare_loader(tok, base);
  std::vector<DataLoader> pooled;
  for (int64_t workers : {1, 3}) {
    DataLoaderOptions c = base;
    c.num_workers = workers;
    pooled.push_back(shakespeare_loader(tok, c));
  }
  for (int i = 0; i < 40; ++i) {
    const Batch want = inline_loader.next();
    for (auto& loader : pooled) REQUIRE(at::equal(loader.next().input, want.input));
  }
  for (auto& loader : pooled) CHECK(loader.state() == inline_loader.state());
}

TEST_CASE("DataLoader document packing: positions and segment ids restart per document, no label across", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const auto corpus = titan::data::make_corpus("sample", titan::test::sample_documents());
  const int64_t B = 2, S = 40;
  DataLoader concat(corpus, tok, {.local_batch_size = B, .seq_len = S});
  DataLoader doc(corpus, tok, {.local_batch_size = B, .seq_len = S, .packing = titan::Packing::document});
  const int32_t bos = *tok->bos_id();
  for (int step = 0; step < 6; ++step) {
    const Batch c = concat.next(), d = doc.next();
    CHECK(at::equal(c.input, d.input));  // the same windows as concat
    REQUIRE(d.positions.sizes() == at::IntArrayRef{B, S});
    for (int64_t b = 0; b < B; ++b) {
      const auto in = row(d.input, b), lab = row(d.labels, b), pos = row(d.positions, b), ids = row(d.document_ids, b);
      const auto concat_labels = row(c.labels, b);
      CHECK(pos[0] == 0);
      CHECK(ids[0] == 0);
      for (int64_t t = 1; t < S; ++t) {
        INFO("step " << step << " row " << b << " t " << t);
        const bool starts = in[size_t(t)] == bos;
        CHECK(pos[size_t(t)] == (starts ? 0 : pos[size_t(t - 1)] + 1));
        CHECK(ids[size_t(t)] == ids[size_t(t - 1)] + (starts ? 1 : 0));
        // The label of the token before a document start is masked; all others are concat's.
        CHECK(lab[size_t(t - 1)] == (starts ? titan::kIgnoreIndex : concat_labels[size_t(t - 1)]));
      }
    }
  }
}

TEST_CASE("DataLoader: a dataset that yields no tokens is an error, not a hang", "[data]") {
  const auto tok = titan::test::tiny_tokenizer(300, /*bos_eos=*/false);
  CHECK_FALSE(tok->bos_id().has_value());
  const auto corpus = titan::data::make_corpus("blank", {"", "", ""});
  DataLoader loader(corpus, tok, {.local_batch_size = 1, .seq_len = 4});
  CHECK_THROWS_WITH(loader.next(), Contains("\"blank\"") && Contains("none"));
  CHECK_THROWS_WITH(DataLoader(corpus, tok, {.dp_rank = 2, .dp_degree = 2}), Contains("dp_rank"));
  DataLoader with_workers(corpus, tok, {.local_batch_size = 1, .seq_len = 4, .num_workers = 2});
  CHECK_THROWS_WITH(with_workers.next(), Contains("\"blank\""));  // a worker's error reaches next()
  CHECK_THROWS_WITH(with_workers.next(), Contains("\"blank\""));  // and again, rather than a hang
}
