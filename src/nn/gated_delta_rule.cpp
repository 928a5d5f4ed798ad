// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/gated_delta_rule.hpp"

#include <ATen/ATen.h>

#include <limits>
#include <vector>

#include "titan/core/error.hpp"

namespace titan::nn {
namespace {

// The inputs per value head, (B, H, S, ...) in the compute dtype, each key head repeated over its value heads.
struct PerHead {
  at::Tensor q;        // (B, Hv, S, dk)
  at::Tensor k;        // (B, Hv, S, dk)
  at::Tensor v;        // (B, Hv, S, dv)
  at::Tensor g;        // (B, Hv, S)
  at::Tensor beta;     // (B, Hv, S)
  at::Tensor segment;  // (B, 1, S) int64: index of each token's document run; undefined: one document
};

PerHead per_head(const DeltaRuleInputs& in, const char* where) {
  TITAN_CHECK_VALUE(in.q.dim() == 4 && in.k.sizes() == in.q.sizes() && in.v.dim() == 4 &&
                        in.v.size(0) == in.q.size(0) && in.v.size(1) == in.q.size(1) &&
                        in.v.size(2) % in.q.size(2) == 0 && in.g.sizes() == in.v.sizes().slice(0, 3) &&
                        in.beta.sizes() == in.g.sizes(),
                    "[{}] expected q, k (B, S, Hk, dk), v (B, S, Hv, dv) with Hk dividing Hv, g and beta (B, S, Hv), "
                    "got q {}, k {}, v {}, g {}, beta {}. Fix the layer's projections.",
                    where, c10::str(in.q.sizes()), c10::str(in.k.sizes()), c10::str(in.v.sizes()),
                    c10::str(in.g.sizes()), c10::str(in.beta.sizes()));
  TITAN_CHECK_VALUE(in.v.size(1) > 0, "[{}] expected at least one token, got none.", where);
  const at::ScalarType dtype = in.v.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t repeat = in.v.size(2) / in.q.size(2);
  const auto heads = [&](const at::Tensor& x) {  // (B, S, H, ...) -> (B, H, S, ...)
    return x.transpose(1, 2).to(dtype).contiguous();
  };
  const auto widen = [&](const at::Tensor& x) { return repeat == 1 ? x : x.repeat_interleave(repeat, 2); };
  PerHead h{.q = heads(widen(in.q)),
            .k = heads(widen(in.k)),
            .v = heads(in.v),
            .g = heads(in.g),
            .beta = heads(in.beta),
            .segment = {}};
  if (in.document_ids.defined()) {
    const at::Tensor& ids = in.document_ids;  // (B, S)
    TITAN_CHECK_VALUE(ids.dim() == 2 && ids.size(0) == in.v.size(0) && ids.size(1) == in.v.size(1),
                      "[{}] expected document ids (B={}, S={}), got {}.", where, in.v.size(0), in.v.size(1),
                      c10::str(ids.sizes()));
    h.segment = document_runs(ids).unsqueeze(1).to(h.v.device());
  }
  if (in.initial_state.defined()) {
    TITAN_CHECK_VALUE(in.initial_state.dim() == 4 && in.initial_state.size(1) == in.v.size(2) &&
                          in.initial_state.size(2) == in.q.size(3) && in.initial_state.size(3) == in.v.size(3),
                      "[{}] expected an initial state (B, Hv={}, dk={}, dv={}), got {}.", where, in.v.size(2),
                      in.q.size(3), in.v.size(3), c10::str(in.initial_state.sizes()));
  }
  return h;
}

at::Tensor start_state(const DeltaRuleInputs& in, const PerHead& h) {
  if (in.initial_state.defined()) return in.initial_state.to(h.v.scalar_type());
  return at::zeros({h.v.size(0), h.v.size(1), h.q.size(3), h.v.size(3)}, h.v.options());  // (B, Hv, dk, dv)
}

// (B, H, S, ...) -> (B, H, N, C, ...), zero-padded to N * C tokens (a zero key writes nothing, g = 0 decays nothing).
at::Tensor chunked(const at::Tensor& x, int64_t chunk) {
  const int64_t pad = (chunk - x.size(2) % chunk) % chunk;
  const at::Tensor padded = x.dim() == 4 ? at::constant_pad_nd(x, {0, 0, 0, pad}) : at::constant_pad_nd(x, {0, pad});
  std::vector<int64_t> sizes{x.size(0), x.size(1), -1, chunk};
  if (x.dim() == 4) sizes.push_back(x.size(3));
  return padded.reshape(sizes);
}

}  // namespace

at::Tensor document_runs(const at::Tensor& document_ids) {
  const int64_t seq = document_ids.size(1);
  const at::Tensor starts = document_ids.narrow(1, 1, seq - 1).ne(document_ids.narrow(1, 0, seq - 1));  // (B, S-1)
  return at::constant_pad_nd(starts.to(at::kLong).cumsum(1), {1, 0});                                   // (B, S)
}

at::Tensor l2_normalize(const at::Tensor& x, double eps) {
  return x * at::rsqrt((x * x).sum(-1, /*keepdim=*/true) + eps);  // (..., d)
}

DeltaRuleOutput chunk_gated_delta_rule(const DeltaRuleInputs& in, int64_t chunk_size) {
  constexpr const char* kWhere = "titan::nn::chunk_gated_delta_rule";
  TITAN_CHECK_VALUE(chunk_size > 0, "[{}] expected chunk_size > 0, got {}.", kWhere, chunk_size);
  const PerHead h = per_head(in, kWhere);
  const int64_t seq = h.v.size(2);
  const int64_t C = chunk_size;
  const at::Tensor q = chunked(h.q, C);                            // (B, H, N, C, dk)
  const at::Tensor k = chunked(h.k, C);                            // (B, H, N, C, dk)
  const at::Tensor beta = chunked(h.beta, C);                      // (B, H, N, C)
  const at::Tensor v_beta = chunked(h.v, C) * beta.unsqueeze(-1);  // (B, H, N, C, dv)
  const at::Tensor k_beta = k * beta.unsqueeze(-1);                // (B, H, N, C, dk)
  const at::Tensor cum = chunked(h.g, C).cumsum(-1);               // (B, H, N, C): log decay since the chunk began
  // Decay from the chunk's start to each token, from each token to the chunk's end, and over the whole chunk.
  at::Tensor from_start = cum.exp();                                          // (B, H, N, C)
  at::Tensor to_end = (cum.narrow(-1, C - 1, 1) - cum).exp();                 // (B, H, N, C)
  at::Tensor seen = at::ones({C, C}, h.v.options().dtype(at::kBool)).tril();  // (C, C): token j <= token i
  if (h.segment.defined()) {
    // Padding joins the last document; the state entering a chunk belongs to the token before it (the first
    // chunk's, to the first token's document).
    const at::Tensor seg =
        chunked(at::cat({h.segment, h.segment.narrow(2, seq - 1, 1).expand({-1, -1, q.size(2) * C - seq})}, 2),
                C);  // (B, 1, N, C)
    const at::Tensor before = chunked(at::cat({h.segment.narrow(2, 0, 1), h.segment}, 2).narrow(2, 0, seq), C)
                                  .narrow(-1, 0, 1);        // (B, 1, N, 1): the run of the token before each chunk
    seen = seen & seg.unsqueeze(-1).eq(seg.unsqueeze(-2));  // (B, 1, N, C, C): same run
    from_start = from_start * seg.eq(before);               // the entering state reaches only its own run
    to_end = to_end * seg.eq(seg.narrow(-1, C - 1, 1));     // only the last token's run reaches the next chunk
  }
  const at::Tensor chunk_decay = from_start.narrow(-1, C - 1, 1).unsqueeze(-1);  // (B, H, N, 1, 1)
  const at::Tensor decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2))
                               .masked_fill(seen.logical_not(), -std::numeric_limits<double>::infinity())
                               .exp();  // (B, H, N, C, C): exp(cum_i - cum_j) for j <= i in i's run, else 0
  // Within a chunk the deltas u solve (I + A) u = beta v - beta a S0^T k, A strictly lower triangular with
  // A_ij = beta_i (decay i <- j) k_i . k_j: one unit-triangular solve for the values, one for the state's part.
  const at::Tensor system =
      (k_beta.matmul(k.transpose(-1, -2)) * decay).tril(-1) + at::eye(C, h.v.options());  // (B, H, N, C, C)
  const at::Tensor values =
      at::linalg_solve_triangular(system, v_beta, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  const at::Tensor state_reads =
      at::linalg_solve_triangular(system, k_beta * from_start.unsqueeze(-1), /*upper=*/false, /*left=*/true,
                                  /*unitriangular=*/true);          // (B, H, N, C, dk)
  const at::Tensor within = q.matmul(k.transpose(-1, -2)) * decay;  // (B, H, N, C, C): causal, diagonal included
  const at::Tensor q_decayed = q * from_start.unsqueeze(-1);        // (B, H, N, C, dk)
  const at::Tensor k_decayed = k * to_end.unsqueeze(-1);            // (B, H, N, C, dk)
  at::Tensor state = start_state(in, h);                            // (B, H, dk, dv)
  std::vector<at::Tensor> outs;
  for (int64_t n = 0; n < q.size(2); ++n) {
    const at::Tensor deltas = values.select(2, n) - state_reads.select(2, n).matmul(state);     // (B, H, C, dv)
    outs.push_back(q_decayed.select(2, n).matmul(state) + within.select(2, n).matmul(deltas));  // (B, H, C, dv)
    state = state * chunk_decay.select(2, n) + k_decayed.select(2, n).transpose(-1, -2).matmul(deltas);
  }
  const at::Tensor out = at::stack(outs, 2).flatten(2, 3).narrow(2, 0, seq);  // (B, H, S, dv)
  return {out.transpose(1, 2).to(in.v.scalar_type()), state};
}

DeltaRuleOutput recurrent_gated_delta_rule(const DeltaRuleInputs& in) {
  const PerHead h = per_head(in, "titan::nn::recurrent_gated_delta_rule");
  at::Tensor state = start_state(in, h);  // (B, H, dk, dv)
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < h.v.size(2); ++t) {
    at::Tensor decay = h.g.select(2, t).exp();  // (B, H)
    if (h.segment.defined() && t > 0) {
      decay = decay * h.segment.select(2, t).eq(h.segment.select(2, t - 1));  // a new document starts empty
    }
    const at::Tensor k = h.k.select(2, t);  // (B, H, dk)
    state = state * decay.unsqueeze(-1).unsqueeze(-1);
    const at::Tensor read = k.unsqueeze(-2).matmul(state).squeeze(-2);                       // (B, H, dv): S^T k
    const at::Tensor delta = (h.v.select(2, t) - read) * h.beta.select(2, t).unsqueeze(-1);  // (B, H, dv)
    state = state + k.unsqueeze(-1).matmul(delta.unsqueeze(-2));                             // (B, H, dk, dv)
    outs.push_back(h.q.select(2, t).unsqueeze(-2).matmul(state).squeeze(-2));                // (B, H, dv)
  }
  return {at::stack(outs, 1).to(in.v.scalar_type()), state};  // (B, S, H, dv)
}

}  // namespace titan::nn
