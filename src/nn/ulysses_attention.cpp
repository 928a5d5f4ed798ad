// SPDX-License-Identifier: BSD-3-Clause
// Ulysses context parallelism (DeepSpeed-Ulysses): around attention, one all-to-all over the cp group turns
// this rank's tokens of every head into every token of 1/cp of the heads; attention then runs on the whole
// sequence as on one device, and a second all-to-all turns the output back. Built from differentiable
// pieces (dist::all_to_all, whose backward is the reverse all-to-all, and index_select), so autograd
// derives the backward.
#include <ATen/ATen.h>

#include "titan/core/error.hpp"
#include "titan/dist/functional.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/nn/sequence_attention.hpp"

namespace titan::nn {
namespace {

// Global token index of each position of the rank-major concatenation of every rank's local tokens (what
// the all-to-all delivers): under headtail balancing that is the balanced order, not 0..S-1.
at::Tensor gathered_order(const SequenceLayout& layout, const at::Device& device) {
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < layout.degree; ++r) {
    SequenceLayout of_r = layout;
    of_r.rank = r;
    parts.push_back(of_r.token_index(device));
  }
  return at::cat(parts);  // (S)
}

// KV heads repeated (each `f` times, f the smallest divisor of the group size that lets cp divide them) when
// the cp degree does not divide the local KV heads: every query head keeps its own KV head.
at::Tensor repeat_kv_for(const at::Tensor& kv, int64_t q_heads, int64_t degree) {
  const int64_t kv_heads = kv.size(1), group = q_heads / kv_heads;
  int64_t f = 1;
  while ((kv_heads * f) % degree != 0 || group % f != 0) ++f;
  return f == 1 ? kv : kv.repeat_interleave(f, 1);  // (B, KVH*f, L, HD)
}

}  // namespace

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const SequenceSharding& sharding, const at::Tensor& document_ids,
                             const WholeSequenceAttention& attend) {
  const SequenceLayout& layout = sharding.layout;
  const int64_t n = layout.degree;
  TITAN_CHECK_VALUE(sharding.group && sharding.group->size() == n,
                    "[titan::nn::ulysses_attention] expected a cp group of {} ranks, got {}.", n,
                    sharding.group ? sharding.group->size() : 0);
  layout.check("titan::nn::ulysses_attention");
  TITAN_CHECK_VALUE(
      q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(1) % k.size(1) == 0 &&
          q.size(2) == layout.local_len() && k.size(2) == layout.local_len(),
      "[titan::nn::ulysses_attention] expected q (B, H, {}, HD), k and v (B, KVH, {}, HD) with H a "
      "multiple of KVH, got q {}, k {}, v {}.",
      layout.local_len(), layout.local_len(), c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes()));
  TITAN_CHECK_VALUE(q.size(1) % n == 0,
                    "[titan::nn::ulysses_attention] expected this rank's query heads ({} = n_heads / "
                    "parallelism.tensor_parallel_degree) divisible by parallelism.context_parallel_degree {}: "
                    "Ulysses gives each cp rank whole heads. Choose n_heads divisible by tp x cp, or set "
                    "parallelism.context_parallel_rotate_method allgather.",
                    q.size(1), n);
  TITAN_CHECK_VALUE(!document_ids.defined() || (document_ids.dim() == 2 && document_ids.size(0) == q.size(0) &&
                                                document_ids.size(1) == layout.seq_len),
                    "[titan::nn::ulysses_attention] expected document ids (B={}, S={}) of the whole sequence, got {}.",
                    q.size(0), layout.seq_len, c10::str(document_ids.sizes()));
  if (n == 1) return attend(q, k, v, 0, {.document_ids = document_ids});
  const dist::ProcessGroup& group = *sharding.group;
  // Rank r gets heads [r H/n, (r+1) H/n) of every rank's tokens, concatenated in rank order along the
  // sequence; under load balancing that order is permuted back to 0..S-1 before attention (and the
  // output's into the balanced order after), so causal and document masks see true token indices.
  const at::Tensor order = layout.load_balance ? gathered_order(layout, q.device()) : at::Tensor();  // (S)
  const at::Tensor restore = layout.load_balance ? at::argsort(order) : at::Tensor();                // (S)
  const auto to_heads = [&](const at::Tensor& x) {
    const at::Tensor whole = dist::all_to_all(x, group, /*split_dim=*/1, /*cat_dim=*/2);  // (B, X/n, S, HD)
    return layout.load_balance ? whole.index_select(2, restore) : whole;
  };
  const at::Tensor qh = to_heads(q);                               // (B, H/n, S, HD)
  const at::Tensor kh = to_heads(repeat_kv_for(k, q.size(1), n));  // (B, KVH'/n, S, HD)
  const at::Tensor vh = to_heads(repeat_kv_for(v, q.size(1), n));  // (B, KVH'/n, S, HD)
  // The output travels as (B, S, H/n, HD) and arrives as (B, L, H, HD), the layout the caller's transpose back
  // to (B, L, H*HD) reads as a view: the output projection keeps no second copy of it.
  at::Tensor out =
      attend(qh, kh, vh, layout.rank * qh.size(1), {.document_ids = document_ids}).transpose(1, 2);  // (B, S, H/n, HD)
  if (layout.load_balance) out = out.index_select(1, order);
  return dist::all_to_all(out, group, /*split_dim=*/1, /*cat_dim=*/2).transpose(1, 2);  // (B, H, L, HD)
}

}  // namespace titan::nn
