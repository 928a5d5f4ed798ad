// SPDX-License-Identifier: BSD-3-Clause
// Helpers for the data tests: id-by-id comparison with context, and a small BPE trained in memory so
// packing tests need no tokenizer files.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "titan/data/bpe_trainer.hpp"
#include "titan/data/corpus.hpp"

namespace titan::test {

inline std::vector<std::string> sample_documents() {
  return {"The quick brown fox jumps over the lazy dog.",
          "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer",
          "A",
          "",
          "Pack my box with five dozen liquor jugs! 12345 + 678 = 13023",
          "Caf\u00e9 na\u00efve \u6771\u4eac \U0001F642 \u2014 the end."};
}

/// Empty when equal; else where the first difference is, with the text around it.
inline std::string first_mismatch(const std::vector<int32_t>& ours, const std::vector<int32_t>& hf,
                                  const data::Tokenizer& tok) {
  size_t i = 0;
  while (i < ours.size() && i < hf.size() && ours[i] == hf[i]) ++i;
  if (i == ours.size() && i == hf.size()) return {};
  auto window = [&](const std::vector<int32_t>& ids) {
    const size_t lo = i >= 8 ? i - 8 : 0, hi = std::min(ids.size(), i + 8);
    std::string s;
    for (size_t k = lo; k < hi; ++k) {
      s += fmt::format("{}{}:{:?}", k == i ? ">>" : " ", ids[k], tok.decode(std::span(&ids[k], 1)));
    }
    return s;
  };
  return fmt::format("first mismatch at token {} of {} (ours) / {} (HF)\n ours: {}\n HF:   {}", i, ours.size(),
                     hf.size(), window(ours), window(hf));
}

/// A byte-level BPE of `vocab_size` trained on sample_documents(); with `bos_eos` false it has no
/// BOS/EOS tokens.
inline std::shared_ptr<data::BpeTokenizer> tiny_tokenizer(int64_t vocab_size = 300, bool bos_eos = true) {
  data::BpeTrainerConfig config;
  config.vocab_size = vocab_size;
  if (!bos_eos) config.bos_token = config.eos_token = "";
  data::BpeTrainer trainer(config);
  for (const std::string& doc : sample_documents()) trainer.add_text(doc);
  return trainer.train().tokenizer();
}

}  // namespace titan::test

namespace titan::test {

/// Every document of `corpus`, in order.
inline std::vector<std::string> read_all_documents(const data::Corpus& corpus) {
  std::vector<std::string> docs;
  for (int64_t i = 0; i < corpus.size(); ++i) docs.push_back(corpus.document(i));
  return docs;
}

}  // namespace titan::test
