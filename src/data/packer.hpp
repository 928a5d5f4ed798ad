// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: tokenized documents -> windows of seq_len + 1 tokens (Packing modes), with a
// carry-over buffer that is part of the loader state.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <deque>
#include <vector>

#include "document_stream.hpp"

namespace titan::data::detail {

/// Per-token flags.
enum TokenFlag : uint8_t {
  kTrainable = 1,  // a valid target: its label is the token (else -100)
  kDocStart = 2,   // first token of a document
  kPadding = 4,    // filler after a short document (padded packing)
};

struct TokenizedDoc {
  std::vector<int32_t> ids{};
  std::vector<uint8_t> flags{};  // per id; kDocStart on the first
  StreamPosition after{};        // the stream position after this document
  bool skipped = false;          // a bad record skipped by policy (no ids)
};

/// seq_len + 1 tokens and their flags.
struct Window {
  std::vector<int32_t> ids{};
  std::vector<uint8_t> flags{};
};

class Packer {
 public:
  Packer(Packing mode, int64_t seq_len, int32_t pad_id);

  void add(const TokenizedDoc& doc);
  /// Moves the next whole window into `out`; false when more documents are needed.
  bool pop(Window& out);

  /// The tokens not yet in a window (and padded windows not yet popped are impossible at a batch
  /// boundary: padded mode pops each window as it is made).
  nlohmann::json carry() const;
  void load_carry(const nlohmann::json& j);

 private:
  Packing mode_;
  size_t window_;  // seq_len + 1
  int32_t pad_id_;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> flags_;
  size_t head_ = 0;
  std::deque<Window> ready_;  // padded mode
};

/// Writes window `w` into row `row` of the batch tensors' buffers (each (B, S) int64).
void write_row(const Window& w, Packing mode, int64_t row, int64_t S, int64_t* input, int64_t* labels,
               int64_t* positions, int64_t* document_ids);

}  // namespace titan::data::detail
