// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: the byte-level BPE merge core shared by the tokenizer (encoding pieces) and
// its tests. Vocab entries are spelled in the byte-level alphabet; input pieces are raw bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace titan::data::detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

struct BpeMerge {
  int32_t left, right, merged;  // token ids; rank = position in the merge list
};

struct BpeModelOptions {
  std::optional<int32_t> unk_id;  // bytes missing from the vocab become this (else they are dropped)
  bool fuse_unk = false;          // consecutive unknown bytes become one unk
  bool ignore_merges = false;     // a piece that is itself a vocab entry is emitted whole (Llama 3)
};

class BpeModel {
 public:
  BpeModel(StringMap<int32_t> vocab, const std::vector<BpeMerge>& merges, BpeModelOptions options);

  const StringMap<int32_t>& vocab() const { return vocab_; }

  /// Appends the ids of one pre-tokenized piece (raw bytes) to `out`. Thread-safe.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  void merge(std::string_view piece, std::vector<int32_t>& out) const;

  // NOTE: as in HF, a byte whose character is not in the vocab is dropped when there is no unk.
  int32_t byte_ids_[256];
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left,right) -> (rank, merged)
  StringMap<int32_t> vocab_;                                          // byte-level spelling -> id
  BpeModelOptions options_;

  // Piece -> ids. Most pieces of natural text repeat, so this is what makes encoding fast.
  mutable std::shared_mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace titan::data::detail
