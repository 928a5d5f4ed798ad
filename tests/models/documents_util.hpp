// SPDX-License-Identifier: BSD-3-Clause
// Per-document packing for the models' parity runs: two documents in every row, and the one-rank reference
// run with and without them.
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace titan::test {

/// Two documents per row of a (batch, seq) batch, split at a row-dependent token (5, 8, 11, ... mod seq - 2):
/// (document ids, per-document positions), both (batch, seq) int64.
inline std::pair<at::Tensor, at::Tensor> two_documents_per_row(int64_t batch, int64_t seq) {
  const at::Tensor t = at::arange(seq, at::kLong).unsqueeze(0);                                    // (1, S)
  const at::Tensor split = ((at::arange(batch, at::kLong) * 3 + 5) % (seq - 2) + 1).unsqueeze(1);  // (B, 1)
  const at::Tensor ids = (t >= split).to(at::kLong);                                               // (B, S)
  return {ids, t - ids * split};
}

/// The one-rank run a parity test compares against, computed once per kind: `train(documents)` returns it.
template <class Result, class Train>
const Result& one_rank_reference(bool documents, const Train& train) {
  if (documents) {
    static const Result with_documents = train(true);
    return with_documents;
  }
  static const Result plain = train(false);
  return plain;
}

}  // namespace titan::test
