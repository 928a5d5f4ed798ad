// SPDX-License-Identifier: BSD-3-Clause
// Context parallelism: each batch's sequences split along the sequence over the mesh's cp axis, so a
// rank holds S/cp tokens of every row and the activations of S/cp tokens. Everything but attention is
// per token and runs unchanged on the local tokens; attention (nn::causal_attention under the batch's
// AttentionContext) attends across the split exactly. Labels are split the same way, so each rank's
// loss covers its tokens; the trainer normalises by the valid tokens of the whole global batch (dp x cp)
// and FSDP sums gradients over dp_shard x cp.
//
//   auto parallel = titan::parallelize(model, mesh, plan);            // plan.context_parallel names the attentions
//   parallel::LocalBatch local = parallel.local_batch({.tokens = tokens, .labels = labels});
//   at::Tensor logits = model.forward(local.tokens, local.attention);   // RoPE positions, documents, the split
//   at::Tensor loss = parallel.cross_entropy_sum(logits, local.labels) / global_valid;
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "titan/nn/attention_context.hpp"
#include "titan/parallel/plan.hpp"

namespace titan::dist {
class Mesh;
class ProcessGroup;
}  // namespace titan::dist

namespace titan::parallel {

/// A batch as the data loader gives it: whole sequences.
struct SequenceBatch {
  at::Tensor tokens{};        ///< (B, S) int64
  at::Tensor labels{};        ///< (B, S) int64, -100 = ignore
  at::Tensor positions{};     ///< (B, S) int64 per-document positions (document packing); undefined = 0..S-1
  at::Tensor document_ids{};  ///< (B, S) int64 document of each token (document packing); undefined = one per row
};

/// This rank's part of a batch and the attention context its forward runs under.
struct LocalBatch {
  at::Tensor tokens{};               ///< (B, S/cp) int64
  at::Tensor labels{};               ///< (B, S/cp) int64
  nn::AttentionContext attention{};  ///< RoPE positions, documents and the split of these tokens
};

/// The batch whole (no context parallelism), with its positions and documents as the attention context.
LocalBatch whole_batch(const SequenceBatch& batch);

/// The sequence split of one rank of the cp axis.
class ContextParallel {
 public:
  ContextParallel(const dist::Mesh& mesh, const ContextParallelPlan& plan);

  /// This rank's tokens, labels, RoPE positions (the tokens' true positions) and the attention context.
  LocalBatch shard(const SequenceBatch& batch) const;
  /// How a sequence of seq_len tokens is split (seq_len must be a multiple of 2 x cp with load balancing).
  nn::SequenceLayout layout(int64_t seq_len) const;
  int64_t degree() const;
  const ContextParallelPlan& plan() const { return plan_; }
  /// "CP(cp=2, headtail, allgather)"
  std::string describe() const;

 private:
  std::shared_ptr<const dist::ProcessGroup> group_;
  ContextParallelPlan plan_;
};

}  // namespace titan::parallel
