// SPDX-License-Identifier: BSD-3-Clause
// The gated delta rule, the recurrence of Gated DeltaNet linear attention (Yang, Kautz and Hatamizadeh, "Gated
// Delta Networks: Improving Mamba2 with Delta Rule", 2024), in plain ATen: the reference every faster kernel is
// tested against. Per value head, with a state S (dk, dv), a decay a_t = exp(g_t) in (0, 1] and a step
// beta_t in (0, 1):
//
//   S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T        o_t = S_t^T q_t
//
// (the paper writes S transposed). The caller L2-normalises q and k and scales q. Two forms compute it:
//   chunk_gated_delta_rule      training: chunks of C tokens, each solved at once (the WY/UT form: one
//                               triangular solve and a few matmuls per chunk), the state carried between chunks;
//                               differentiable through plain ATen ops.
//   recurrent_gated_delta_rule  decoding: one token at a time, the state carried in and out.
// Both compute in fp32 (fp64 for fp64 inputs) and return the output in v's dtype and the final state in the compute
// dtype. With document ids, the state (and each token's view of earlier ones) restarts at every new document.
//
//   auto [out, state] = nn::chunk_gated_delta_rule({.q = q, .k = k, .v = v, .g = g, .beta = beta});
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace titan::nn {

/// One forward's inputs. Each key head serves Hv / Hk consecutive value heads (HF's repeat_interleave).
struct DeltaRuleInputs {
  at::Tensor q{};              // (B, S, Hk, dk): L2-normalised and scaled
  at::Tensor k{};              // (B, S, Hk, dk): L2-normalised
  at::Tensor v{};              // (B, S, Hv, dv)
  at::Tensor g{};              // (B, S, Hv): log decay, <= 0
  at::Tensor beta{};           // (B, S, Hv): the delta rule's step
  at::Tensor initial_state{};  // (B, Hv, dk, dv); undefined: zeros
  at::Tensor document_ids{};   // (B, S) int64: the state restarts at each new document; undefined: one document
};

struct DeltaRuleOutput {
  at::Tensor out;    // (B, S, Hv, dv) in v's dtype
  at::Tensor state;  // (B, Hv, dk, dv): the state after the last token (of its document), compute dtype
};

/// Training form: chunks of chunk_size tokens (the sequence padded to a multiple of it).
DeltaRuleOutput chunk_gated_delta_rule(const DeltaRuleInputs& in, int64_t chunk_size = 64);
/// Decoding form: one token after the other.
DeltaRuleOutput recurrent_gated_delta_rule(const DeltaRuleInputs& in);

/// Each token's document run (B, S) int64, counting from 0 along each row: a new run wherever the id changes (a
/// document is contiguous; an id that comes back later starts another run).
at::Tensor document_runs(const at::Tensor& document_ids);

/// x / sqrt(sum(x^2) + eps) over the last dim (FLA's and HF's l2norm, eps inside the root), in x's dtype.
at::Tensor l2_normalize(const at::Tensor& x, double eps = 1e-6);

}  // namespace titan::nn
