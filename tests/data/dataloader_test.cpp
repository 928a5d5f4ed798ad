// SPDX-License-Identifier: BSD-3-Clause
// Packing (torchtitan v0.2.2's windows of seq_len + 1), the data-parallel split, and state resume.
// ATen before Catch: c10's logging defines a CHECK macro that Catch's must replace.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "titan/data/dataloader.hpp"

#include <catch2/catch.hpp>

#include "data_test_util.hpp"
#include "test_util.hpp"

using titan::data::DataLoader;
using titan::data::DataLoaderConfig;

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
    CHECK(batch.labels.scalar_type() == at::kLong);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t w = step * B + b;
      CHECK(row(batch.input, b) == window_part(stream, w, S, 0));
      CHECK(row(batch.labels, b) == window_part(stream, w, S, 1));
    }
    // Labels are the inputs shifted by one inside a window.
    CHECK(at::equal(batch.input.slice(1, 1), batch.labels.slice(1, 0, S - 1)));
  }
  CHECK(loader.epoch() >= 1);  // the 6 sample documents are far fewer than 8 * 3 * 17 tokens

  // Every document contributes BOS first and EOS last; the empty one contributes just those two.
  const auto empty_doc = tok->encode("", true, true);
  CHECK(empty_doc == std::vector<int32_t>{*tok->bos_id(), *tok->eos_id()});
  const auto bos_count = std::count(stream.begin(), stream.begin() + 200, *tok->bos_id());
  const auto eos_count = std::count(stream.begin(), stream.begin() + 200, *tok->eos_id());
  CHECK(bos_count >= 2);
  CHECK(std::abs(bos_count - eos_count) <= 1);
}

TEST_CASE("DataLoader: dp ranks 1, 2 and 4 partition the same global window stream", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const auto corpus = titan::data::make_corpus("sample", titan::test::sample_documents());
  const int64_t B = 2, S = 8, steps = 5;
  const auto stream = expected_stream(*corpus, *tok, (steps * B * 4 + 1) * (S + 1));
  for (int64_t N : {1, 2, 4}) {
    for (int64_t r = 0; r < N; ++r) {
      DataLoader loader(corpus, tok, {.local_batch_size = B, .seq_len = S, .dp_rank = r, .dp_degree = N});
      for (int64_t step = 0; step < steps; ++step) {
        const auto batch = loader.next();
        for (int64_t b = 0; b < B; ++b) {
          INFO("dp " << N << " rank " << r << " step " << step << " row " << b);
          CHECK(row(batch.input, b) == window_part(stream, step * B * N + b * N + r, S, 0));
        }
      }
    }
  }
}

TEST_CASE("DataLoader state: restore continues identically for 20 batches, also under another dp degree", "[data]") {
  const auto tok = titan::test::tiny_tokenizer();
  const auto corpus = titan::data::make_corpus("sample", titan::test::sample_documents());
  const DataLoaderConfig config{.local_batch_size = 2, .seq_len = 13};
  DataLoader first(corpus, tok, config);
  for (int i = 0; i < 7; ++i) first.next();
  const std::string saved = first.state().dump();
  std::vector<titan::data::Batch> expected;
  for (int i = 0; i < 20; ++i) expected.push_back(first.next());

  DataLoader resumed(corpus, tok, config);
  resumed.load_state(nlohmann::json::parse(saved));
  for (int i = 0; i < 20; ++i) {
    const auto batch = resumed.next();
    INFO("batch " << i);
    CHECK(at::equal(batch.input, expected[i].input));
    CHECK(at::equal(batch.labels, expected[i].labels));
  }

  // Two ranks of dp 2 with batch 1 read the global batch of dp 1 with batch 2, row by row.
  for (int64_t r = 0; r < 2; ++r) {
    DataLoader rank(corpus, tok, {.local_batch_size = 1, .seq_len = 13, .dp_rank = r, .dp_degree = 2});
    rank.load_state(nlohmann::json::parse(saved));
    for (int i = 0; i < 20; ++i) CHECK(at::equal(rank.next().input[0], expected[i].input[r]));
  }

  auto other = titan::data::make_corpus("other", titan::test::sample_documents());
  DataLoader wrong(other, tok, config);
  CHECK_THROWS_WITH(wrong.load_state(nlohmann::json::parse(saved)), Catch::Matchers::Contains("\"sample\""));
}

TEST_CASE("DataLoader: a dataset that yields no tokens is an error, not a hang", "[data]") {
  const auto tok = titan::test::tiny_tokenizer(300, /*bos_eos=*/false);
  CHECK_FALSE(tok->bos_id().has_value());
  const auto corpus = titan::data::make_corpus("blank", {"", "", ""});
  DataLoader loader(corpus, tok, {.local_batch_size = 1, .seq_len = 4});
  CHECK_THROWS_WITH(loader.next(), Catch::Matchers::Contains("\"blank\"") && Catch::Matchers::Contains("none"));
  CHECK_THROWS_WITH(DataLoader(corpus, tok, {.dp_rank = 2, .dp_degree = 2}), Catch::Matchers::Contains("dp_rank"));
}
