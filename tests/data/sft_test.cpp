// SPDX-License-Identifier: BSD-3-Clause
// SFT data: chat JSONL rendered through the template; labels are -100 everywhere but on the
// assistant turns' tokens, padded (one conversation per row) or packed.
#include <ATen/ATen.h>

#include "titan/data/dataloader.hpp"
#include "titan/nn/loss.hpp"

#include <catch2/catch.hpp>

#include "data_test_util.hpp"
#include "test_util.hpp"

using titan::Packing;
using titan::data::DataLoader;

namespace {

const char* kChats = R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
                     R"( {"role": "assistant", "content": "Hello there!"}, {"role": "user", "content": "Bye"},)"
                     R"( {"role": "assistant", "content": "Goodbye."}]})"
                     "\n"
                     R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})"
                     "\n";

std::vector<int32_t> to_ids(const at::Tensor& row) {
  const at::Tensor r = row.contiguous();
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

}  // namespace

TEST_CASE("SFT: the label mask covers exactly the assistant tokens", "[data]") {
  titan::test::TempDir tmp;
  titan::test::write_file(tmp.path / "chat.jsonl", kChats);
  const auto tok = titan::test::tiny_tokenizer();
  const titan::data::CorpusSpec spec{.format = titan::DatasetFormat::chat, .path = tmp.path / "chat.jsonl"};
  // What each conversation trains on: its assistant contents, each with the turn_end marker.
  const std::vector<std::string> assistant = {"Hello there!<|end|>\nGoodbye.<|end|>\n", "4<|end|>\n"};
  const std::vector<std::string> rendered = {
      "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello there!<|end|>\n"
      "<|user|>\nBye<|end|>\n<|assistant|>\nGoodbye.<|end|>\n",
      "<|user|>\n2+2?<|end|>\n<|assistant|>\n4<|end|>\n"};
  const int64_t S = 200;

  SECTION("padded: one conversation per row") {
    DataLoader loader({{.source = titan::data::open_source("chat", spec), .weight = 1.0}}, tok,
                      {.local_batch_size = 1, .seq_len = S, .packing = Packing::padded, .loop = false});
    for (size_t c = 0; c < 2; ++c) {
      const auto batch = loader.next();
      const auto input = to_ids(batch.input[0]), labels = to_ids(batch.labels[0]);
      const auto doc_ids = to_ids(batch.document_ids[0]);
      // The row is BOS + the rendered chat + EOS, then padding (document id -1).
      const auto length = size_t(std::count_if(doc_ids.begin(), doc_ids.end(), [](int32_t d) { return d >= 0; }));
      CHECK(input[0] == *tok->bos_id());
      CHECK(input[length - 1] == *tok->eos_id());
      CHECK(tok->decode(std::span(input).subspan(1, length - 2)) == rendered[c]);
      // Trained labels, in order, spell exactly the assistant turns; nothing else is trained.
      std::vector<int32_t> trained;
      for (size_t t = 0; t < labels.size(); ++t) {
        if (labels[t] == titan::kIgnoreIndex) continue;
        CHECK(labels[t] == (t + 1 < input.size() ? input[t + 1] : labels[t]));
        trained.push_back(labels[t]);
      }
      CHECK(tok->decode(trained) == assistant[c]);
      // ...and as many tokens as the assistant turns have (no prompt token slipped in).
      size_t expected = 0;
      for (const auto& turn : {std::string("Hello there!<|end|>\n"), std::string("Goodbye.<|end|>\n")}) {
        if (c == 0) expected += tok->encode(turn).size();
      }
      if (c == 1) expected = tok->encode("4<|end|>\n").size();
      CHECK(trained.size() == expected);
    }
    CHECK_FALSE(loader.try_next().has_value());  // one pass: two conversations
    CHECK_FALSE(loader.try_next().has_value());
    CHECK_THROWS_WITH(loader.next(), Catch::Matchers::Contains("try_next"));
  }
  SECTION("packed: the same mask inside the concatenated stream") {
    DataLoader loader({{.source = titan::data::open_source("chat", spec), .weight = 1.0}}, tok,
                      {.local_batch_size = 1, .seq_len = 40, .packing = Packing::document});
    std::string trained_text;
    std::vector<int32_t> trained;
    for (int i = 0; i < 12; ++i) {
      const auto labels = to_ids(loader.next().labels[0]);
      for (int32_t l : labels) {
        if (l != titan::kIgnoreIndex) trained.push_back(l);
      }
    }
    // Whole passes of the two conversations: the trained text repeats their assistant turns.
    const std::string text = tok->decode(trained);
    const std::string pass = assistant[0] + assistant[1];
    REQUIRE(text.size() >= pass.size());
    CHECK(pass.find(text.substr(0, 10)) != std::string::npos);
    CHECK(text.find("<|user|>") == std::string::npos);
    CHECK(text.find("Be brief") == std::string::npos);
    CHECK(text.find("Goodbye.<|end|>\n4<|end|>\nHello there!") != std::string::npos);
  }
}
