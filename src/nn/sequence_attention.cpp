// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/sequence_attention.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "attention_blocks.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/functional.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/nn/saved_ops.hpp"

namespace titan::nn {
namespace {

using detail::BlockMask;
using torch::autograd::variable_list;

// Point-to-point tags of the ring exchange (one exchange is in flight at a time per group).
constexpr int64_t kTagKv = 0x4350;
constexpr int64_t kTagKvGrad = 0x4351;

// (B, S, S) true where query i of q (B, H, S, HD) may see key j: j <= i within the same document.
at::Tensor within_documents(const at::Tensor& document_ids, const at::Tensor& q) {
  const int64_t S = q.size(2);
  TITAN_CHECK_VALUE(document_ids.dim() == 2 && document_ids.size(0) == q.size(0) && document_ids.size(1) == S,
                    "[titan::nn::causal_attention] expected document ids (B={}, S={}), got {}.", q.size(0), S,
                    c10::str(document_ids.sizes()));
  const at::Tensor docs = document_ids.to(q.device());                                 // (B, S)
  const at::Tensor causal = at::ones({S, S}, docs.options().dtype(at::kBool)).tril();  // (S, S)
  return (docs.unsqueeze(2) == docs.unsqueeze(1)).logical_and(causal);
}

// The blocks one query chunk computes against one source rank's keys: the chunks strictly before it
// (seen whole), and its own chunk (causal). Chunks after it are fully masked and skipped.
struct Piece {
  int64_t q_chunk = 0;                // local index of the query chunk
  std::vector<int64_t> key_chunks{};  // local indices (in the source's layout) of the key chunks
  bool diagonal = false;              // the key chunk is the query chunk itself
};

std::vector<Piece> pieces_for(const SequenceLayout& layout, int64_t source) {
  const std::vector<int64_t> mine = layout.chunks_of(layout.rank);
  const std::vector<int64_t> theirs = layout.chunks_of(source);
  std::vector<Piece> pieces;
  for (size_t a = 0; a < mine.size(); ++a) {
    Piece before{.q_chunk = static_cast<int64_t>(a)};
    for (size_t b = 0; b < theirs.size(); ++b) {
      if (theirs[b] < mine[a]) before.key_chunks.push_back(static_cast<int64_t>(b));
      if (theirs[b] == mine[a]) {
        pieces.push_back(
            {.q_chunk = static_cast<int64_t>(a), .key_chunks = {static_cast<int64_t>(b)}, .diagonal = true});
      }
    }
    if (!before.key_chunks.empty()) pieces.push_back(std::move(before));
  }
  return pieces;
}

// Everything one attention call needs again in backward.
struct Problem {
  SequenceSharding sharding;
  at::Tensor document_ids;  // (B, S_whole) int64 or undefined
  double scale = 1.0;

  int64_t chunk() const { return sharding.layout.chunk_len(); }

  // The tokens of `chunks` (local indices into rank `owner`'s layout) of x (.., L, HD), concatenated.
  at::Tensor take(const at::Tensor& x, const std::vector<int64_t>& chunks) const {
    std::vector<at::Tensor> parts;
    for (int64_t c : chunks) parts.push_back(x.narrow(2, c * chunk(), chunk()));
    return parts.size() == 1 ? parts[0] : at::cat(parts, 2);
  }

  // Document ids (B, n * C) of global chunks.
  at::Tensor docs(const std::vector<int64_t>& global_chunks) const {
    std::vector<at::Tensor> parts;
    for (int64_t g : global_chunks) parts.push_back(document_ids.narrow(1, g * chunk(), chunk()));
    return at::cat(parts, 1);
  }

  // The mask of a piece; nullopt when no query of it sees any key (skip the block).
  std::optional<BlockMask> mask(const Piece& p, int64_t source, const at::Tensor& q) const {
    if (!document_ids.defined()) return BlockMask{.causal = p.diagonal};
    const SequenceLayout& layout = sharding.layout;
    const int64_t q_global = layout.chunks_of(layout.rank)[static_cast<size_t>(p.q_chunk)];
    std::vector<int64_t> k_global;
    for (int64_t c : p.key_chunks) k_global.push_back(layout.chunks_of(source)[static_cast<size_t>(c)]);
    const at::Tensor dq = docs({q_global}).to(q.device());    // (B, C)
    const at::Tensor dk = docs(k_global).to(q.device());      // (B, Lk)
    at::Tensor allowed = dq.unsqueeze(2) == dk.unsqueeze(1);  // (B, C, Lk)
    if (p.diagonal) allowed = allowed.logical_and(at::ones({chunk(), chunk()}, allowed.options()).tril());
    if (!allowed.any().item<bool>()) return std::nullopt;
    const at::Tensor additive =
        at::zeros(allowed.sizes(), q.options()).masked_fill(allowed.logical_not(), -INFINITY).unsqueeze(1);
    return BlockMask{.causal = false, .additive = additive, .visible = allowed.any(2).unsqueeze(1)};
  }

  int64_t degree() const { return sharding.layout.degree; }
  int64_t rank() const { return sharding.layout.rank; }
  const dist::ProcessGroup& group() const { return *sharding.group; }
};

// Receives `in` from the previous rank of the ring while sending `out` to the next, as one batch: at cp 2
// both are the same peer, and under NCCL two ranks that each post their receive first wait for ever.
dist::Work ring_exchange(const Problem& pb, const at::Tensor& out, at::Tensor& in, int64_t tag) {
  const int64_t n = pb.degree(), r = pb.rank();
  return pb.group().batch_isend_irecv({{.send = false, .tensor = in, .peer = (r - 1 + n) % n, .tag = tag},
                                       {.send = true, .tensor = out, .peer = (r + 1) % n, .tag = tag}});
}

// Calls visit(source, kv) for every source rank's (K, V) stacked as (2, B, KVH, L, HD): gathered all at
// once (allgather), or passed around the ring with the next transfer in flight during the visit.
void for_each_source(const Problem& pb, const at::Tensor& kv,
                     const std::function<void(int64_t, const at::Tensor&)>& visit) {
  const int64_t n = pb.degree(), r = pb.rank();
  if (n == 1) return visit(r, kv);
  if (pb.sharding.rotate == CpRotateMethod::allgather) {
    const at::Tensor all = dist::detail::gather_along(kv, pb.group(), 0);  // (2n, B, KVH, L, HD)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t source = (r - i + n) % n;  // the same order as the ring: own block first
      visit(source, all.narrow(0, 2 * source, 2));
    }
    return;
  }
  at::Tensor current = kv;
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor next;
    dist::Work exchange;
    if (i + 1 < n) {
      next = at::empty_like(current);
      exchange = ring_exchange(pb, current, next, kTagKv);
    }
    visit((r - i + n) % n, current);
    if (i + 1 < n) {
      exchange.wait();
      current = next;
    }
  }
}

struct Forward {
  at::Tensor out;  // (B, H, L, HD) in q's dtype
  at::Tensor lse;  // (B, H, L) float32
};

Forward forward_impl(const Problem& pb, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t chunks = static_cast<int64_t>(pb.sharding.layout.chunks_of(pb.rank()).size());
  std::vector<at::Tensor> outs, lses;
  for (int64_t a = 0; a < chunks; ++a) {
    const at::Tensor qa = q.narrow(2, a * pb.chunk(), pb.chunk());
    outs.push_back(at::zeros(qa.sizes(), qa.options().dtype(at::kFloat)));
    lses.push_back(at::full({q.size(0), q.size(1), pb.chunk()}, -INFINITY, qa.options().dtype(at::kFloat)));
  }
  for_each_source(pb, at::stack({k, v}), [&](int64_t source, const at::Tensor& kv) {
    for (const Piece& p : pieces_for(pb.sharding.layout, source)) {
      const at::Tensor qa = q.narrow(2, p.q_chunk * pb.chunk(), pb.chunk());
      const auto mask = pb.mask(p, source, q);
      if (!mask) continue;
      const auto block =
          detail::attend_block(qa, pb.take(kv[0], p.key_chunks), pb.take(kv[1], p.key_chunks), *mask, pb.scale);
      detail::merge_block(outs[static_cast<size_t>(p.q_chunk)], lses[static_cast<size_t>(p.q_chunk)], block);
    }
  });
  // Laid out as (B, L, H, HD) like the flash kernels' output, so the caller's transpose back to
  // (B, L, H*HD) is a view, not one more saved copy.
  at::Tensor out = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
  for (int64_t a = 0; a < chunks; ++a) out.narrow(2, a * pb.chunk(), pb.chunk()).copy_(outs[static_cast<size_t>(a)]);
  return {out, at::cat(lses, 2)};
}

std::array<at::Tensor, 3> backward_impl(const Problem& pb, const at::Tensor& grad, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v, const Forward& fwd) {
  const int64_t n = pb.degree(), C = pb.chunk();
  at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));  // (B, H, L, HD)
  const at::Tensor kv = at::stack({k, v});                              // (2, B, KVH, L, HD)
  // Key/value gradients of every source (allgather: reduce-scattered after), or of the source in
  // hand, travelling around the ring with it and arriving home after n hops.
  const bool ring = pb.sharding.rotate != CpRotateMethod::allgather && n > 1;
  at::Tensor dkv_all =
      ring ? at::Tensor()
           : at::zeros({2 * n, k.size(0), k.size(1), k.size(2), k.size(3)}, k.options().dtype(at::kFloat));
  at::Tensor dkv = ring ? at::zeros(kv.sizes(), kv.options().dtype(at::kFloat)) : at::Tensor();
  for_each_source(pb, kv, [&](int64_t source, const at::Tensor& kv_src) {
    at::Tensor target = ring ? dkv : dkv_all.narrow(0, 2 * source, 2);
    for (const Piece& p : pieces_for(pb.sharding.layout, source)) {
      const auto mask = pb.mask(p, source, q);
      if (!mask) continue;
      const auto rows = [&](const at::Tensor& t) { return t.narrow(2, p.q_chunk * C, C); };
      const auto [gq, gk, gv] = detail::attend_block_backward(rows(grad), rows(q), pb.take(kv_src[0], p.key_chunks),
                                                              pb.take(kv_src[1], p.key_chunks), rows(fwd.out),
                                                              rows(fwd.lse), *mask, pb.scale);
      rows(dq).add_(gq);
      for (size_t j = 0; j < p.key_chunks.size(); ++j) {
        const int64_t at_key = p.key_chunks[j] * C;
        target[0].narrow(2, at_key, C).add_(gk.narrow(2, static_cast<int64_t>(j) * C, C));
        target[1].narrow(2, at_key, C).add_(gv.narrow(2, static_cast<int64_t>(j) * C, C));
      }
    }
    if (!ring) return;
    at::Tensor next = at::empty_like(dkv);
    ring_exchange(pb, dkv, next, kTagKvGrad).wait();
    dkv = next;
  });
  if (!ring) dkv = n == 1 ? dkv_all : dist::detail::scatter_sum_along(dkv_all, pb.group(), 0);  // (2, ...)
  return {dq.to(q.scalar_type()), dkv[0].to(k.scalar_type()), dkv[1].to(v.scalar_type())};
}

struct ContextParallelAttentionBackward : torch::autograd::Node {
  ContextParallelAttentionBackward(Problem problem, at::Tensor q, at::Tensor k, at::Tensor v, Forward fwd)
      : pb(std::move(problem)), q(std::move(q)), k(std::move(k)), v(std::move(v)), fwd(std::move(fwd)) {}

  variable_list apply(variable_list&& grads) override {
    at::NoGradGuard no_grad;
    TITAN_CHECK(grads[0].defined(), "[titan::nn::context_parallel_attention] expected an output gradient, got none.");
    auto [dq, dk, dv] = backward_impl(pb, grads[0], q, k, v, fwd);
    return {dq, dk, dv};
  }
  std::string name() const override { return "titan::ContextParallelAttentionBackward"; }
  void release_variables() override {
    q.reset();
    k.reset();
    v.reset();
    fwd = {};
  }

  Problem pb;
  at::Tensor q, k, v;  // detached inputs
  Forward fwd;         // merged output and log-sum-exp
};

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const SequenceLayout& layout) {
  TITAN_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes(),
                    "[titan::nn::context_parallel_attention] expected q (B, H, S, HD), k and v (B, KVH, S, HD), got "
                    "q {}, k {}, v {}.",
                    c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes()));
  TITAN_CHECK_VALUE(q.size(1) % k.size(1) == 0,
                    "[titan::nn::context_parallel_attention] expected query heads ({}) a multiple of key/value heads "
                    "({}).",
                    q.size(1), k.size(1));
  TITAN_CHECK_VALUE(q.size(2) == layout.local_len() && k.size(2) == layout.local_len(),
                    "[titan::nn::context_parallel_attention] expected {} local tokens (seq_len {} over {} cp ranks), "
                    "got q {} and k {}. Shard the batch with the same layout.",
                    layout.local_len(), layout.seq_len, layout.degree, q.size(2), k.size(2));
}

}  // namespace

at::Tensor context_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const SequenceSharding& sharding, const at::Tensor& document_ids) {
  if (sharding.rotate == CpRotateMethod::ulysses) {
    return ulysses_attention(q, k, v, sharding, document_ids,
                             [](const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh, int64_t,
                                const AttentionContext& whole) { return causal_attention(qh, kh, vh, whole); });
  }
  TITAN_CHECK_VALUE(sharding.group && sharding.group->size() == sharding.layout.degree,
                    "[titan::nn::context_parallel_attention] expected a cp group of {} ranks, got {}.",
                    sharding.layout.degree, sharding.group ? sharding.group->size() : 0);
  sharding.layout.check("titan::nn::context_parallel_attention");
  check_shapes(q, k, v, sharding.layout);
  TITAN_CHECK_VALUE(!document_ids.defined() || (document_ids.dim() == 2 && document_ids.size(0) == q.size(0) &&
                                                document_ids.size(1) == sharding.layout.seq_len),
                    "[titan::nn::context_parallel_attention] expected document ids (B={}, S={}) of the whole "
                    "sequence, got {}.",
                    q.size(0), sharding.layout.seq_len, c10::str(document_ids.sizes()));
  Problem pb{.sharding = sharding,
             .document_ids = document_ids.defined() ? document_ids.to(at::kCPU) : at::Tensor(),
             .scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)))};
  Forward fwd;
  {
    at::NoGradGuard no_grad;
    fwd = forward_impl(pb, q, k, v);
  }
  at::Tensor out = fwd.out;
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    auto node = std::shared_ptr<ContextParallelAttentionBackward>(
        new ContextParallelAttentionBackward(std::move(pb), q.detach(), k.detach(), v.detach(),
                                             {fwd.out.detach(), fwd.lse}),
        torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
    torch::autograd::set_history(out, node);
  }
  return out;
}

at::Tensor local_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& document_ids) {
  const bool gqa = q.size(1) != k.size(1);
  if (!document_ids.defined()) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, /*scale=*/std::nullopt, gqa);
  }
  const at::Tensor allowed = within_documents(document_ids, q);  // (B, S, S)
  return at::scaled_dot_product_attention(q, k, v, allowed.unsqueeze(1), /*dropout_p=*/0.0, /*is_causal=*/false,
                                          /*scale=*/std::nullopt, gqa);
}

namespace {

// One device's attention as the kernel that returns the log-sum-exp, one autograd node: what a
// per-operator checkpoint keeps (output and lse) and rebuilds over the recomputed q, k, v.
struct KeptAttentionBackward : torch::autograd::Node {
  KeptAttentionBackward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor lse, BlockMask mask,
                        double scale)
      : q_(std::move(q)),
        k_(std::move(k)),
        v_(std::move(v)),
        out_(std::move(out)),
        lse_(std::move(lse)),
        mask_(std::move(mask)),
        scale_(scale) {}

  variable_list apply(variable_list&& grads) override {
    at::NoGradGuard no_grad;
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    if (!q_.is_cuda()) {
      // Called as autograd calls the CPU flash kernel's backward (the output gradient as it comes), so
      // the gradients equal the plain scaled_dot_product_attention's bitwise.
      const std::optional<at::Tensor> additive =
          mask_.additive.defined() ? std::optional<at::Tensor>(mask_.additive) : std::nullopt;
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          grads[0], q_, k_, v_, out_, lse_, /*dropout_p=*/0.0, mask_.causal, additive, scale_);
      return {dq, dk, dv};
    }
    auto [dq, dk, dv] = detail::attend_block_backward(grads[0], q_, k_, v_, out_, lse_, mask_, scale_);
    return {dq, dk, dv};
  }
  std::string name() const override { return "titan::KeptAttentionBackward"; }
  void release_variables() override {
    q_.reset();
    k_.reset();
    v_.reset();
    out_.reset();
    lse_.reset();
    mask_ = {};
  }

 private:
  at::Tensor q_, k_, v_;  // detached inputs
  at::Tensor out_;        // (B, H, S, HD) detached output
  at::Tensor lse_;        // (B, H, S) float32
  BlockMask mask_;
  double scale_;
};

// Causal within documents when `document_ids` (B, S) is defined; the additive form of the boolean mask
// scaled_dot_product_attention builds (0 or -inf), so the kernel sees the same numbers.
BlockMask whole_sequence_mask(const at::Tensor& q, const at::Tensor& document_ids) {
  if (!document_ids.defined()) return {.causal = true};
  const at::Tensor allowed = within_documents(document_ids, q);  // (B, S, S)
  const at::Tensor additive = at::zeros(allowed.sizes(), q.options()).masked_fill(allowed.logical_not(), -INFINITY);
  return {.causal = false, .additive = additive.unsqueeze(1)};  // (B, 1, S, S)
}

// local_causal_attention under a per-operator checkpoint: the forward keeps (out, lse), the recompute
// takes them back with a node over its q, k, v.
at::Tensor kept_attention(SavedOps& ops, SavedOpsScope::Phase phase, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& document_ids) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  BlockMask mask = whole_sequence_mask(q, document_ids);
  if (phase == SavedOpsScope::Phase::record) {
    detail::BlockResult r = detail::attend_block(q, k, v, mask, scale);
    nn::detail::record_entry(ops, "attention", {r.out, r.lse});
    return r.out;
  }
  SavedOps::Entry& entry = nn::detail::next_entry(ops, "attention");
  at::Tensor out = std::exchange(entry.kept[0], {});  // (B, H, S, HD)
  at::Tensor lse = std::exchange(entry.kept[1], {});  // (B, H, S)
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    auto node = std::shared_ptr<KeptAttentionBackward>(
        new KeptAttentionBackward(q.detach(), k.detach(), v.detach(), out.detach(), std::move(lse), std::move(mask),
                                  scale),
        torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(q, k, v));
    torch::autograd::set_history(out, node);
  }
  return out;
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionContext& context) {
  if (context.sharding) return context_parallel_attention(q, k, v, *context.sharding, context.document_ids);
  // Where bf16 GEMMs run widened (nn/bf16_gemm.hpp), so does attention: ATen's CPU flash kernel in fp32
  // over the bf16 q, k, v, its output rounded to bf16 (about twice as fast as its bf16 form without AMX).
  // Its inner products and softmax are fp32 in both forms; the bf16 kernel also rounds the probabilities
  // to bf16 before multiplying them by v, which this form does not.
  if (widens(q, k) && v.scalar_type() == at::kBFloat16) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);  // CPU autocast lists SDPA
    return causal_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), context).to(at::kBFloat16);
  }
  if (const nn::detail::ActiveOps active = nn::detail::active_ops(); active.ops != nullptr) {
    return kept_attention(*active.ops, active.phase, q, k, v, context.document_ids);
  }
  return local_causal_attention(q, k, v, context.document_ids);
}

}  // namespace titan::nn
