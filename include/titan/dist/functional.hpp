// SPDX-License-Identifier: BSD-3-Clause
// Differentiable collectives: each forward collective is wired into autograd with its conjugate as
// the backward (all-gather <-> reduce-scatter, all-reduce <-> identity, all-to-all <-> all-to-all).
// They are what tensor/sequence parallel layers are written with (Megatron's f and g).
#pragma once

#include <ATen/core/Tensor.h>

#include "titan/dist/process_group.hpp"

namespace titan::dist {

/// Concatenates every rank's x along dim (group-rank order). Backward: reduce-scatter (SUM) of the
/// gradient along dim.
at::Tensor all_gather(const at::Tensor& x, const ProcessGroup& group, int64_t dim = 0);

/// This rank's chunk along dim of the SUM of every rank's x. Backward: all-gather along dim.
at::Tensor reduce_scatter(const at::Tensor& x, const ProcessGroup& group, int64_t dim = 0);

/// SUM of every rank's x. Backward: identity (Megatron's g: the gradient is already replicated).
at::Tensor all_reduce(const at::Tensor& x, const ProcessGroup& group);

/// Identity. Backward: all-reduce SUM of the gradient (Megatron's f: the input is replicated, its
/// consumers are sharded).
at::Tensor copy_to_group(const at::Tensor& x, const ProcessGroup& group);

/// Concatenates every rank's x along dim, for consumers that use it replicated (every rank computes
/// the same thing from it). Backward: this rank's chunk of the (replicated) gradient, no
/// communication (Megatron's gather_from_tensor_model_parallel_region).
at::Tensor gather_to_replicate(const at::Tensor& x, const ProcessGroup& group, int64_t dim);

/// This rank's chunk along dim of a replicated x. Backward: all-gather of the gradient along dim.
at::Tensor split_to_shard(const at::Tensor& x, const ProcessGroup& group, int64_t dim);

/// Splits x into group.size() chunks along split_dim, sends chunk r to rank r, concatenates what
/// arrives along cat_dim. Backward: the reverse all-to-all.
at::Tensor all_to_all(const at::Tensor& x, const ProcessGroup& group, int64_t split_dim, int64_t cat_dim);

/// A collective issued now and finished by finish(): whatever runs between the two overlaps it
/// (async tensor parallelism). finish() returns the result wired into autograd like the blocking
/// version (all_gather's backward: reduce-scatter; reduce_scatter's: all-gather).
class PendingCollective {
 public:
  at::Tensor finish();

 private:
  friend PendingCollective all_gather_start(const at::Tensor&, const ProcessGroup&, int64_t);
  friend PendingCollective reduce_scatter_start(const at::Tensor&, const ProcessGroup&, int64_t);
  static PendingCollective start(bool gather, const at::Tensor& x, const ProcessGroup& group, int64_t dim);
  bool gather = true;
  at::Tensor input{};   // what the caller passed (the autograd edge)
  at::Tensor buffer{};  // the collective's output, rank-major for a gather
  at::Tensor source{};  // the collective's input buffer, alive while it runs
  Work work{};
  ProcessGroup group = ProcessGroup::single("pending");
  int64_t dim = 0;
};
PendingCollective all_gather_start(const at::Tensor& x, const ProcessGroup& group, int64_t dim = 0);
PendingCollective reduce_scatter_start(const at::Tensor& x, const ProcessGroup& group, int64_t dim = 0);

namespace detail {
/// The non-differentiable kernels (also used by FSDP and the checkpointer).
at::Tensor gather_along(const at::Tensor& x, const ProcessGroup& group, int64_t dim);
at::Tensor scatter_sum_along(const at::Tensor& x, const ProcessGroup& group, int64_t dim);
}  // namespace detail

}  // namespace titan::dist
