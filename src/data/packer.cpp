// SPDX-License-Identifier: BSD-3-Clause
// Packer and the window -> batch row conversion (see packer.hpp).
#include "packer.hpp"

#include <nlohmann/json.hpp>

#include "titan/core/error.hpp"
#include "titan/nn/loss.hpp"

namespace titan::data::detail {

Packer::Packer(Packing mode, int64_t seq_len, int32_t pad_id)
    : mode_(mode), window_(size_t(seq_len + 1)), pad_id_(pad_id) {}

void Packer::add(const TokenizedDoc& doc) {
  if (doc.ids.empty()) return;
  if (mode_ == Packing::padded) {
    const size_t n = std::min(doc.ids.size(), window_);
    Window w{.ids = std::vector<int32_t>(window_, pad_id_), .flags = std::vector<uint8_t>(window_, kPadding)};
    std::copy_n(doc.ids.begin(), n, w.ids.begin());
    std::copy_n(doc.flags.begin(), n, w.flags.begin());
    ready_.push_back(std::move(w));
    return;
  }
  if (head_ > 0 && head_ >= ids_.size() / 2) {
    ids_.erase(ids_.begin(), ids_.begin() + std::ptrdiff_t(head_));
    flags_.erase(flags_.begin(), flags_.begin() + std::ptrdiff_t(head_));
    head_ = 0;
  }
  ids_.insert(ids_.end(), doc.ids.begin(), doc.ids.end());
  flags_.insert(flags_.end(), doc.flags.begin(), doc.flags.end());
}

bool Packer::pop(Window& out) {
  if (mode_ == Packing::padded) {
    if (ready_.empty()) return false;
    out = std::move(ready_.front());
    ready_.pop_front();
    return true;
  }
  if (ids_.size() - head_ < window_) return false;
  const auto begin = std::ptrdiff_t(head_), end = std::ptrdiff_t(head_ + window_);
  out.ids.assign(ids_.begin() + begin, ids_.begin() + end);
  out.flags.assign(flags_.begin() + begin, flags_.begin() + end);
  head_ += window_;
  return true;
}

nlohmann::json Packer::carry() const {
  // Flags are almost all kTrainable: keep only the exceptions, as [index, flags] pairs.
  nlohmann::json exceptions = nlohmann::json::array();
  for (size_t i = head_; i < flags_.size(); ++i) {
    if (flags_[i] != kTrainable) exceptions.push_back({i - head_, flags_[i]});
  }
  return {{"tokens", std::vector<int32_t>(ids_.begin() + std::ptrdiff_t(head_), ids_.end())},
          {"flags", std::move(exceptions)}};
}

void Packer::load_carry(const nlohmann::json& j) {
  ids_ = j.at("tokens").get<std::vector<int32_t>>();
  flags_.assign(ids_.size(), kTrainable);
  for (const auto& e : j.at("flags")) {
    const auto i = e.at(0).get<size_t>();
    TITAN_CHECK_VALUE(i < flags_.size(),
                      "[titan::data::DataLoader] expected carry flags inside the {} carried "
                      "tokens, got index {}. The state is corrupt.",
                      flags_.size(), i);
    flags_[i] = e.at(1).get<uint8_t>();
  }
  head_ = 0;
  ready_.clear();
}

void write_row(const Window& w, Packing mode, int64_t row, int64_t S, int64_t* input, int64_t* labels,
               int64_t* positions, int64_t* document_ids) {
  const bool per_document = mode != Packing::concat;
  int64_t position = 0, segment = 0;
  for (int64_t t = 0; t < S; ++t) {
    const size_t i = size_t(t), next = size_t(t + 1);
    input[row * S + t] = w.ids[i];
    // No label across documents in per-document modes: the next document's BOS is not predictable.
    const bool crosses = per_document && (w.flags[next] & kDocStart);
    const bool target = (w.flags[next] & kTrainable) && !(w.flags[next] & kPadding) && !crosses;
    labels[row * S + t] = target ? w.ids[next] : kIgnoreIndex;
    if (!per_document) continue;
    // Segments restart at each document start and at the row start (a document continued from the
    // previous window starts a new segment at position 0).
    if (t > 0 && (w.flags[i] & kDocStart)) {
      ++segment;
      position = 0;
    }
    const bool pad = w.flags[i] & kPadding;
    positions[row * S + t] = pad ? 0 : position++;
    document_ids[row * S + t] = pad ? -1 : segment;
  }
}

}  // namespace titan::data::detail
