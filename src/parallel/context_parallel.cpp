// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/context_parallel.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"

namespace titan::parallel {

LocalBatch whole_batch(const SequenceBatch& batch) {
  return {.tokens = batch.tokens,
          .labels = batch.labels,
          .attention = {.positions = batch.positions, .document_ids = batch.document_ids}};
}

ContextParallel::ContextParallel(const dist::Mesh& mesh, const ContextParallelPlan& plan)
    : group_(std::make_shared<dist::ProcessGroup>(mesh.group("cp"))), plan_(plan) {}

int64_t ContextParallel::degree() const { return group_->size(); }

nn::SequenceLayout ContextParallel::layout(int64_t seq_len) const {
  const nn::SequenceLayout layout{
      .seq_len = seq_len, .degree = degree(), .rank = group_->rank(), .load_balance = plan_.load_balance};
  layout.check("titan::parallel::ContextParallel");
  return layout;
}

LocalBatch ContextParallel::shard(const SequenceBatch& batch) const {
  TITAN_CHECK_VALUE(batch.tokens.dim() == 2 && batch.labels.sizes() == batch.tokens.sizes(),
                    "[titan::parallel::ContextParallel] expected tokens and labels (B, S), got {} and {}.",
                    c10::str(batch.tokens.sizes()), c10::str(batch.labels.sizes()));
  auto sharding = std::make_shared<nn::SequenceSharding>(
      nn::SequenceSharding{.group = group_, .layout = layout(batch.tokens.size(1)), .rotate = plan_.rotate});
  const nn::SequenceLayout& l = sharding->layout;
  // The tokens' true positions: their index in the sequence, or in their document.
  at::Tensor positions = batch.positions.defined() ? l.shard(batch.positions, 1) : l.token_index(batch.tokens.device());
  return {.tokens = l.shard(batch.tokens, 1),
          .labels = l.shard(batch.labels, 1),
          .attention = {
              .positions = std::move(positions), .document_ids = batch.document_ids, .sharding = std::move(sharding)}};
}

std::string ContextParallel::describe() const {
  return fmt::format("CP(cp={}, {}, {})", degree(), plan_.load_balance ? "headtail" : "contiguous", plan_.rotate);
}

}  // namespace titan::parallel
