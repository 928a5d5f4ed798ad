// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/attention_context.hpp"

#include <ATen/ATen.h>

#include <utility>

#include "titan/core/error.hpp"

namespace titan::nn {
namespace {
at::Tensor rows_of(const at::Tensor& t, int64_t begin, int64_t count) {
  return t.defined() && t.dim() == 2 ? t.narrow(0, begin, count) : t;
}
}  // namespace

std::vector<int64_t> SequenceLayout::chunks_of(int64_t r) const {
  if (!load_balance) return {r};
  return {r, 2 * degree - 1 - r};
}

at::Tensor SequenceLayout::token_index(const at::Device& device) const {
  std::vector<at::Tensor> parts;
  const int64_t len = chunk_len();
  for (int64_t c : chunks_of(rank)) parts.push_back(at::arange(c * len, (c + 1) * len, at::kLong));
  return at::cat(parts).to(device);
}

at::Tensor SequenceLayout::shard(const at::Tensor& x, int64_t dim) const {
  TITAN_CHECK_VALUE(x.size(dim) == seq_len,
                    "[titan::nn::SequenceLayout] expected dim {} of length {} (the whole sequence), got {}. Shard "
                    "the whole batch once.",
                    dim, seq_len, x.size(dim));
  std::vector<at::Tensor> parts;
  const int64_t len = chunk_len();
  for (int64_t c : chunks_of(rank)) parts.push_back(x.narrow(dim, c * len, len));
  return parts.size() == 1 ? parts[0].contiguous() : at::cat(parts, dim);
}

void SequenceLayout::check(const char* where) const {
  TITAN_CHECK_VALUE(degree >= 1 && rank >= 0 && rank < degree,
                    "[{}] expected a context-parallel rank in [0, {}), got {}.", where, degree, rank);
  TITAN_CHECK_VALUE(seq_len > 0 && seq_len % num_chunks() == 0,
                    "[{}] expected training.seq_len divisible by {} ({} context-parallel ranks{}), got {}. Choose a "
                    "sequence length that is a multiple of {}{}.",
                    where, num_chunks(), degree, load_balance ? " x 2 chunks each for headtail load balancing" : "",
                    seq_len, num_chunks(), load_balance ? " (or turn the load balancer off)" : "");
}

AttentionContext AttentionContext::rows(int64_t begin, int64_t count) const {
  return {.positions = rows_of(positions, begin, count),
          .document_ids = rows_of(document_ids, begin, count),
          .sharding = sharding};
}

void ContextParallelCapable::check_attention_context(const AttentionContext& context, const char* where) const {
  const int64_t running = context.sharding ? context.sharding->layout.degree : 1;
  TITAN_CHECK_VALUE(
      running == cp_degree_,
      "[{}] expected the forward to run on a sequence sharded over {} context-parallel rank(s), got {}. "
      "Pass the attention context of the batch's local part to the forward: "
      "auto local = parallel.local_batch({{tokens, labels}}); model.forward(local.tokens, local.attention).",
      where, cp_degree_, running);
}

}  // namespace titan::nn
