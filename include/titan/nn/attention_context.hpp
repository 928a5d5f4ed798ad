// SPDX-License-Identifier: BSD-3-Clause
// What attention needs to know about the tokens of a forward, beyond their activations: their RoPE
// positions, the documents they belong to (block-causal masking under per-document packing) and, under
// context parallelism, how the sequence is split over the cp ranks. It is an argument of every forward
// down to the attention kernel, never ambient state: a forward given no context is ordinary causal
// attention over 0..S-1 by construction. The context-parallel attention keeps what it needs for
// backward in its autograd node, and a checkpointed block's recompute holds the context it ran with.
//
//   at::Tensor logits = model.forward(tokens, {.positions = positions, .document_ids = document_ids});
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "titan/core/choices.hpp"

namespace titan::dist {
class ProcessGroup;
}

namespace titan::nn {

/// How a sequence of `seq_len` tokens is cut over `degree` context-parallel ranks. With load
/// balancing (torchtitan's headtail) it is cut into 2 x degree chunks and rank r holds chunks r and
/// 2 x degree - 1 - r, so every rank does the same causal work; without, rank r holds chunk r.
struct SequenceLayout {
  /// Tokens in the whole sequence.
  int64_t seq_len = 0;
  /// Ranks the sequence is split over.
  int64_t degree = 1;
  /// This rank's index among them.
  int64_t rank = 0;
  /// headtail load balancing (else contiguous chunks).
  bool load_balance = true;

  /// Chunks the sequence is cut into.
  int64_t num_chunks() const { return load_balance ? 2 * degree : degree; }
  /// Tokens per chunk.
  int64_t chunk_len() const { return seq_len / num_chunks(); }
  /// Tokens one rank holds.
  int64_t local_len() const { return seq_len / degree; }
  /// Global chunk indices held by `r`, in the order its local tokens are laid out.
  std::vector<int64_t> chunks_of(int64_t r) const;
  /// Global token index of each of this rank's local tokens.
  at::Tensor token_index(const at::Device& device) const;  // (local_len) int64
  /// This rank's tokens of x, whose dim `dim` is the whole sequence.
  at::Tensor shard(const at::Tensor& x, int64_t dim) const;
  /// Checks seq_len splits evenly; `where` names the caller in the error.
  void check(const char* where) const;
};

/// A sequence sharded over a context-parallel group: the group and how K/V travel between its ranks.
struct SequenceSharding {
  /// The cp ranks (its size is layout.degree, this rank is layout.rank).
  std::shared_ptr<const dist::ProcessGroup> group{};
  /// How the sequence is split.
  SequenceLayout layout{};
  /// allgather: gather every rank's K/V once; alltoall: pass K/V around the ring, overlapping the
  /// next transfer with the current block's attention.
  CpRotateMethod rotate = CpRotateMethod::allgather;
};

/// The tokens of the running forward.
struct AttentionContext {
  /// RoPE positions of the local tokens: (B, S_local) or (S_local) int64; undefined = 0..S-1.
  at::Tensor positions{};
  /// Document of each token of the WHOLE sequence (B, S) int64 (under CP every rank holds the whole
  /// batch before sharding); tokens attend only within their document. Undefined: one document.
  at::Tensor document_ids{};
  /// Set under context parallelism: the local tokens are this rank's part of the sequence.
  std::shared_ptr<const SequenceSharding> sharding{};

  /// The context of rows [begin, begin + count) of the batch (a pipeline microbatch).
  AttentionContext rows(int64_t begin, int64_t count) const;
};

/// An attention module that computes through nn::causal_attention, so it follows the AttentionContext
/// its forward is given. parallelize() accepts only such modules in plan.context_parallel and tells them
/// the cp degree: a forward under context parallelism without the batch's sharded context is then an
/// error, not a silently local attention.
class ContextParallelCapable {
 public:
  virtual ~ContextParallelCapable() = default;
  /// The number of ranks the sequence is sharded over (1: whole sequences).
  void set_context_parallel_degree(int64_t degree) { cp_degree_ = degree; }
  int64_t context_parallel_degree() const { return cp_degree_; }

 protected:
  /// Throws unless `context` shards the sequence over context_parallel_degree() ranks.
  void check_attention_context(const AttentionContext& context, const char* where) const;

 private:
  int64_t cp_degree_ = 1;
};

}  // namespace titan::nn
