// SPDX-License-Identifier: BSD-3-Clause
// BPE merging by rank, as HF tokenizers' Word::merge_all does it: repeatedly merge the adjacent pair
// with the lowest rank (leftmost on ties), found with a min-heap so long pieces stay O(n log n).
#include "bpe_model.hpp"

#include <mutex>
#include <queue>

#include "titan/data/pre_tokenizer.hpp"

namespace titan::data::detail {
namespace {

constexpr size_t kCacheCapacity = 1 << 17;
constexpr size_t kMaxCachedPieceBytes = 256;

uint64_t pair_key(int32_t a, int32_t b) { return uint64_t(uint32_t(a)) << 32 | uint32_t(b); }

}  // namespace

BpeModel::BpeModel(StringMap<int32_t> vocab, const std::vector<BpeMerge>& merges, BpeModelOptions options)
    : vocab_(std::move(vocab)), options_(options) {
  for (int b = 0; b < 256; ++b) {
    std::string ch = to_byte_level(std::string(1, char(b)));
    auto it = vocab_.find(ch);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& m = merges[rank];
    // A repeated pair takes its last rank, as HF's map construction does.
    merges_.insert_or_assign(pair_key(m.left, m.right), std::pair{int32_t(rank), m.merged});
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  if (options_.ignore_merges) {
    if (auto it = vocab_.find(to_byte_level(piece)); it != vocab_.end()) {
      out.push_back(it->second);
    } else {
      merge(piece, out);
    }
  } else {
    merge(piece, out);
  }
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) {
      cache_.try_emplace(std::string(piece), out.begin() + std::ptrdiff_t(start), out.end());
    }
  }
}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // linked list over the surviving symbols; -1 = none
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  auto push = [&](int32_t id) {
    const auto n = int32_t(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, true});
  };
  bool pending_unk = false;
  for (unsigned char b : piece) {
    const int32_t id = byte_ids_[b];
    if (id >= 0) {
      pending_unk = false;
      push(id);
    } else if (options_.unk_id) {
      if (!(options_.fuse_unk && pending_unk)) push(*options_.unk_id);
      pending_unk = true;
    }
  }

  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    if (auto it = merges_.find(pair_key(sym[pos].id, sym[next].id)); it != merges_.end()) {
      queue.push({it->second.first, pos, it->second.second});
    }
  };
  for (int32_t i = 0; i + 1 < int32_t(sym.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Entries go stale when a neighbour merged first; the pair must still be the one queued.
    const auto it = merges_.find(pair_key(left.id, sym[left.next].id));
    if (it == merges_.end() || it->second.second != top.merged) continue;
    Symbol& right = sym[left.next];
    right.alive = false;
    left.id = top.merged;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const Symbol& s : sym) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace titan::data::detail
