// SPDX-License-Identifier: BSD-3-Clause
// TextDataset: lazy tokenization into a carry-over buffer (see text_dataset.hpp).
#include "titan/data/text_dataset.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"

namespace titan::data {

TextDataset::TextDataset(std::shared_ptr<const Corpus> corpus, std::shared_ptr<const Tokenizer> tokenizer,
                         int64_t seq_len)
    : corpus_(std::move(corpus)), tokenizer_(std::move(tokenizer)), seq_len_(seq_len) {
  TITAN_CHECK_VALUE(corpus_ && tokenizer_, "[titan::data::TextDataset] expected a corpus and a tokenizer, got null.");
  TITAN_CHECK_VALUE(seq_len_ >= 1, "[titan::data::TextDataset] expected training.seq_len >= 1, got {}.", seq_len_);
  TITAN_CHECK_VALUE(corpus_->size() > 0, "[titan::data::TextDataset] dataset \"{}\": expected documents, got none.",
                    corpus_->name());
}

void TextDataset::fill() {
  const auto window = size_t(seq_len_ + 1);
  while (buffer_.size() - head_ < window) {
    if (head_ > 0 && head_ >= buffer_.size() / 2) {
      buffer_.erase(buffer_.begin(), buffer_.begin() + std::ptrdiff_t(head_));
      head_ = 0;
    }
    const std::vector<int32_t> ids = tokenizer_->encode(corpus_->document(document_), true, true);
    buffer_.insert(buffer_.end(), ids.begin(), ids.end());
    empty_run_ = ids.empty() ? empty_run_ + 1 : 0;
    TITAN_CHECK_VALUE(empty_run_ < corpus_->size(), "[titan::data::TextDataset] dataset \"{}\": expected tokens, got "
                      "none from all {} documents. The documents are empty and the tokenizer adds no BOS/EOS.",
                      corpus_->name(), corpus_->size());
    if (++document_ == corpus_->size()) {
      document_ = 0;
      ++epoch_;
      log::info("dataset {}: pass {} over {} documents done after {} windows; re-looping", corpus_->name(), epoch_,
                corpus_->size(), windows_);
    }
  }
}

void TextDataset::next_window(std::span<int32_t> out) {
  TITAN_CHECK_VALUE(int64_t(out.size()) == seq_len_ + 1, "[titan::data::TextDataset] expected a window buffer of "
                    "seq_len + 1 = {} tokens, got {}.", seq_len_ + 1, out.size());
  fill();
  std::copy_n(buffer_.begin() + std::ptrdiff_t(head_), out.size(), out.begin());
  head_ += out.size();
  ++windows_;
}

void TextDataset::skip_window() {
  fill();
  head_ += size_t(seq_len_ + 1);
  ++windows_;
}

nlohmann::json TextDataset::state() const {
  return {{"dataset", corpus_->name()},
          {"document", document_},
          {"epoch", epoch_},
          {"windows", windows_},
          {"buffer", std::vector<int32_t>(buffer_.begin() + std::ptrdiff_t(head_), buffer_.end())}};
}

void TextDataset::load_state(const nlohmann::json& state) {
  const auto fields_ok = state.is_object() && state.contains("dataset") && state.contains("document") &&
                         state.contains("epoch") && state.contains("windows") && state.contains("buffer");
  TITAN_CHECK_VALUE(fields_ok, "[titan::data::TextDataset] expected a state with dataset, document, epoch, windows "
                    "and buffer, got {}.", state.dump().substr(0, 200));
  const auto name = state.at("dataset").get<std::string>();
  TITAN_CHECK_VALUE(name == corpus_->name(),
                    "[titan::data::TextDataset] expected a state saved for dataset \"{}\", "
                    "got one for \"{}\". Resume with the dataset the checkpoint was trained on.",
                    corpus_->name(), name);
  const auto document = state.at("document").get<int64_t>();
  TITAN_CHECK_VALUE(document >= 0 && document < corpus_->size(), "[titan::data::TextDataset] dataset \"{}\": expected "
                    "a saved document index in [0, {}), got {}. The dataset changed since the state was saved.",
                    name, corpus_->size(), document);
  document_ = document;
  epoch_ = state.at("epoch").get<int64_t>();
  windows_ = state.at("windows").get<int64_t>();
  buffer_ = state.at("buffer").get<std::vector<int32_t>>();
  head_ = 0;
  empty_run_ = 0;
}

}  // namespace titan::data
