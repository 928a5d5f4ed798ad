// SPDX-License-Identifier: BSD-3-Clause
// What one block keeps for backward, by the tensors autograd saves for each op titan's layers run (one
// term per saved tensor below), checked against titan's memory tracker on CPU (docs/memory_planner.md):
// the two norms, the attention (the family's model: models/memory_model.hpp), and the feed-forward,
// dense (a SwiGLU) or MoE (router scores and choices, the token permutation, the routed tokens through
// the experts' SwiGLU, the combine, the shared experts; under expert parallelism the all-to-alls'
// permutations).
#include <ATen/core/Tensor.h>

#include <algorithm>

#include "memory_plan_detail.hpp"
#include "titan/core/error.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/gated_deltanet.hpp"
#include "titan/nn/moe.hpp"

namespace titan::planner::detail {
namespace {

// A SwiGLU feed-forward of hidden width F (per rank) over `tokens`: w1 out, silu out, w3 out, their
// product. Compiled, silu(w1 out) and the product are recomputed inside the fused backward kernel from
// the w1 and w3 outputs instead of being stored (inductor's min-cut partitioner saves the matmul outputs).
int64_t swiglu_saved(int64_t tokens, int64_t F, const Shapes& x) { return (x.compiled ? 2 : 4) * tokens * F * x.bytes; }

// The routed experts' activation between w1/w3 and w2, per (slot, hidden feature): the SwiGLU keeps
// w1 out, silu out, w3 out and the product w2 reads; gpt-oss's clamped SwiGLU keeps w1 out, the clamped
// gate, its sigmoid, the gate times the sigmoid, w3 out, the clamped up + 1 and the product.
int64_t expert_activation_saved(const nn::MoE& moe) {
  return moe.args.activation == nn::ExpertActivation::swiglu ? 4 : 7;
}

// An MoE layer over `tokens` (its input, the norm's output, is the block's). N = tokens x top_k slots.
// Its shared experts' matmuls go to `matmuls`.
void add_moe(const nn::MoE& moe, int64_t tokens, const Shapes& x, BlockTerms* t, std::vector<models::Matmul>* matmuls) {
  const int64_t a = x.bytes;
  const int64_t D = x.D;
  const int64_t E = moe.args.num_experts;
  const int64_t K = moe.args.top_k;
  const int64_t F = moe.experts->w1.size(1);  // (E, F, D)
  const int64_t N = tokens * K;
  // Router: softmax/sigmoid keep their fp32 scores (T, E); gather keeps the choices, the first K columns
  // of a (T, E) int64 sort and so all of it; route_norm's division keeps the chosen scores and their sum.
  int64_t router = tokens * E * 4 + tokens * E * 8;
  if (moe.args.route_norm) router += N * 4 + tokens * 4;
  // Permutation: the slots' tokens (index_select) and the slots' order (index_copy back), int64 each.
  int64_t permutation = 2 * N * 8;
  // The combine weights (N) fp32 and one fp32 (N, D): scaled before the experts, the routed tokens the
  // scaling multiplies; after, the per-slot outputs the combine's bmm multiplies.
  const int64_t combine = N * 4 + N * D * 4;
  // Expert parallelism: the received slots' order by local expert and its inverse (int64 each). With
  // balanced routing a rank receives as many slots as it sends.
  if (x.ep > 1) permutation += 2 * N * 8;
  // gpt-oss's expert biases: each slot's expert (int64) for the bias gathers.
  if (moe.args.biased_experts) permutation += N * 8;
  // Under ETP each rank gathers the tp ranks' slots for its experts (etp x N) and runs them on its F / etp
  // hidden slice: the input grows, the hidden activations do not.
  const int64_t routed = x.etp * N * D * a;  // the experts' input, sorted by expert
  const int64_t experts = expert_activation_saved(moe) * N * F * a;
  if (x.etp > 1) permutation += 2 * x.etp * N * 8;  // the gathered slots' order by expert and its inverse
  // The experts' output (N, D), which index_copy keeps (its source's gradient is expanded as the source).
  const int64_t routed_out = N * D * a;
  int64_t saved = router + permutation + combine + routed + experts + routed_out;
  // Under EP with mixed precision each read casts this rank's experts to the compute dtype (FSDP, which
  // would gather them in it, leaves them alone), and the grouped GEMMs keep those copies for backward.
  if (x.ep > 1 && x.expert_copy > 0) {
    const nn::GroupedExperts& e = *moe.experts;
    int64_t numel = 0;  // every (E, ...) weight and bias
    for (const at::Tensor* w : {&e.w1, &e.w2, &e.w3, &e.w1_bias, &e.w2_bias, &e.w3_bias}) {
      if (w->defined()) numel += w->numel();
    }
    saved += numel / x.ep * x.expert_copy;
  }
  if (moe.shared_experts) {
    const int64_t Fs = moe.shared_experts->w1->weight.size(0);
    saved += swiglu_saved(tokens, Fs, x);
    matmuls->insert(matmuls->end(), {{tokens, D, Fs}, {tokens, D, Fs}, {tokens, Fs, D}});
  }
  t->full += saved;
  t->dispatch = routed + routed_out + (x.ep > 1 ? 2 * N * D * a : 0);  // under EP the sent and received slots
  // The forward's worst moment: the zeros the experts' output is scattered into, and the scattered copy.
  t->forward = N * D * a;
  // Backward: the slots' gradient and the experts' SwiGLU gradients in flight (three of (N, F)), by when
  // the combine's backward has freed the per-slot outputs and index_copy's the experts' output.
  t->backward += N * D * a + 3 * N * F * a - routed_out - (moe.args.score_before_experts ? 0 : N * D * 4);
  t->flops += 2.0 * 3.0 * static_cast<double>(N) * static_cast<double>(D) * static_cast<double>(F);
  t->op_recompute += 2.0 * 3.0 * static_cast<double>(N) * static_cast<double>(D) * static_cast<double>(F);
  if (x.ep > 1) t->all_to_all = 2 * N * D * a * (x.ep - 1) / x.ep;
  // ETP: the slots' all-gather over tp before the experts and the partial outputs' reduce-scatter after.
  if (x.etp > 1) t->all_to_all += 2 * N * D * a * (x.etp - 1);
}

}  // namespace

BlockAc block_ac(const parallel::ActivationCheckpointPlan& ac, const std::string& block) {
  if (std::find(ac.modules.begin(), ac.modules.end(), block) == ac.modules.end()) return BlockAc::none;
  return ac.per_op ? BlockAc::op : BlockAc::full;
}

BlockTerms block_terms(const models::DecoderBlock& block, const models::AttentionMemoryModel& attention,
                       const Shapes& x) {
  BlockTerms t;
  const int64_t T = x.tokens();
  const int64_t a = x.bytes;
  const int64_t D = x.D;
  const models::AttentionMemory att = attention(*block.attention, x);
  t.input = x.Tn() * D * a;
  // Both norms (attention_norm keeps the block input, ffn_norm the residual after attention) and the
  // norm output the attention projections read (all-gathered under TP).
  t.full = 2 * models::rms_norm_saved(x.Tn(), D, x) + T * D * a + att.saved + att.gathered_kv;
  std::vector<models::Matmul> matmuls = att.matmuls;
  t.backward = x.Tn() * D * a;  // the gradient arriving at the block's output
  if (block.feed_forward) {
    const int64_t F = block.feed_forward->w1->weight.size(0) / x.tp;
    t.full += T * D * a + swiglu_saved(T, F, x);  // the norm output w1/w3 read, then the SwiGLU
    t.backward += 3 * T * F * a;                  // the SwiGLU's gradients in flight
    matmuls.insert(matmuls.end(), {{T, D, F}, {T, D, F}, {T, F, D}});
  } else if (block.moe) {
    // The MoE runs on this rank's tokens (sequence-parallel under TP) with whole experts: routing is per token.
    const int64_t tokens = x.Tn();
    t.full += tokens * D * a;  // the norm output the router, the slots and the shared experts read
    add_moe(*block.moe, tokens, x, &t, &matmuls);
  }
  // Per-operator checkpointing keeps the block input, every other matmul's output (the 1st, 3rd, ...;
  // an MoE router's gate is always recomputed and not counted) and attention's output and log-sum-exp;
  // the rest (the routed experts' grouped GEMMs too) runs again.
  t.op = t.input + att.attention_out;
  for (size_t i = 0; i < matmuls.size(); ++i) {
    const double flops = 2.0 * static_cast<double>(matmuls[i].rows * matmuls[i].in * matmuls[i].out);
    t.flops += flops;
    if (i % 2 == 0) {
      t.op += matmuls[i].rows * matmuls[i].out * a;
    } else {
      t.op_recompute += flops;
    }
  }
  // Eager SAC stores every output the policy marks; compiled, the partitioner keeps only what the
  // backward reads, and no backward reads the last projection's output (the residual add's gradient needs
  // no input).
  if (x.compiled && matmuls.size() % 2 == 1) t.op -= matmuls.back().rows * matmuls.back().out * a;
  // A Gated DeltaNet block under cp hands the next rank its recurrent state (B, Hv, dk, dv) and the three
  // convolutions' last K-1 inputs, fp32 (docs/qwen3_5.md, "Cost").
  if (const auto* linear = dynamic_cast<const nn::GatedDeltaNet*>(block.attention.get()); linear && x.cp > 1) {
    const nn::GatedDeltaNetOptions& o = linear->options;
    const int64_t state = o.n_value_heads / x.tp * o.key_head_dim * o.value_head_dim;
    const int64_t tail =
        (o.conv_kernel - 1) * (2 * o.n_key_heads * o.key_head_dim + o.n_value_heads * o.value_head_dim) / x.tp;
    t.cp_message = x.b * (state + tail) * 4;
  }
  return t;
}

int64_t head_saved(const Shapes& x) {
  // The norm, its output as the output projection reads it, and what the loss keeps: the fused CPU
  // cross-entropy the logits in their dtype and each token's log-sum-exp, ATen's cross_entropy on fp32
  // logits log_softmax's fp32 output.
  const int64_t T = x.tokens();
  const int64_t loss = x.fused_loss ? T * x.V * x.bytes + T * 8 : T * x.V * 4;
  return models::rms_norm_saved(x.Tn(), x.D, x) + T * x.D * x.bytes + loss;
}

int64_t loss_transient(const Shapes& x) {
  const int64_t T = x.tokens();
  // Fused: the backward's one (T, V) gradient in the logits' dtype.
  if (x.fused_loss) return T * x.V * x.bytes;
  // GPU with loss parallelism as the published runs computed it (DTensor's loss_parallel: its
  // _log_softmax on the local vocab shard): while the result is formed, the bf16 logits (the train step
  // holds them until the loss returns), their fp32 copy, the shifted logits and their exponentials are
  // all alive. Its backward (exp(out) times the summed gradient, subtracted from the gradient) holds three.
  if (x.loss_parallel) return T * x.V * (x.bytes + 3 * 4);
  // ATen's: the logits and their fp32 copy while the loss is computed, then two (T, V) fp32 gradients in
  // backward (of log_softmax's output and of its input).
  const int64_t logits = T * x.V * x.bytes + (x.bytes == 4 ? 0 : T * x.V * 4);
  return std::max(logits, 2 * T * x.V * 4);
}

}  // namespace titan::planner::detail
