// SPDX-License-Identifier: BSD-3-Clause
// Mixture of experts with token-choice top-k routing (torchtitan's MoE, DeepSeek-V3 / Qwen3 style):
// a router scores every token against every expert, each token goes to its top_k experts, the
// routed experts run as one grouped GEMM over tokens permuted so that each expert's tokens are
// contiguous, and optional shared experts (one SwiGLU) see every token. Aux-loss-free load
// balancing: an expert bias, added to the scores for selection only, is moved toward balance by
// update_expert_bias() between optimizer steps. gpt-oss's variant: a router gate with a bias, experts
// whose projections have biases, and a clamped SwiGLU (MoEArgs::gate_bias, biased_experts, activation).
//
//   MoE moe(MoEArgs{.num_experts = 8, .top_k = 2}, /*dim=*/256, /*hidden_dim=*/512, options);
//   at::Tensor y = moe.forward(x);           // x (B, S, 256) -> (B, S, 256)
//   ... backward, then before optimizer.step():
//   moe.update_expert_bias(moe.args.load_balance_coeff);
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/nn/attention.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"

namespace titan::nn {

/// The gated activation of the routed experts between their up projections (w1: gate, w3: up) and w2.
enum class ExpertActivation {
  swiglu,          ///< silu(w1 x) * w3 x (Llama's, DeepSeek-V3's, Qwen3's)
  clamped_swiglu,  ///< gpt-oss: g = min(w1 x, limit), u = clamp(w3 x, -limit, limit); (u + 1) * g * sigmoid(alpha g)
};

/// The MoE layer's configuration (torchtitan's MoEArgs names; `None` there is 0 here).
struct MoEArgs {
  /// Routed experts in the layer.
  int64_t num_experts = 8;
  /// Shared experts (every token, no routing), fused into one SwiGLU of hidden_dim * this; 0 = none.
  int64_t num_shared_experts = 1;
  /// Hidden size of that SwiGLU when it is not hidden_dim * num_shared_experts (Qwen3.5-MoE's
  /// shared_expert_intermediate_size); 0 = hidden_dim * num_shared_experts.
  int64_t shared_expert_dim = 0;
  /// The shared experts' output is multiplied by sigmoid(shared_gate x), shared_gate (1, D) (Qwen3.5-MoE).
  bool shared_expert_gate = false;
  /// Router score function, "softmax" (over experts) or "sigmoid" (per expert); computed in fp32.
  std::string score_func = "sigmoid";
  /// Divide the top_k scores of a token by their sum (DeepSeek-V3 with sigmoid).
  bool route_norm = false;
  /// Multiply the combine weights by this after route_norm.
  double route_scale = 1.0;
  /// Scale each routed token by its weight before the experts (true) or their outputs after (false).
  bool score_before_experts = true;
  /// Experts per token.
  int64_t top_k = 1;
  /// Node-limited routing: experts split into this many groups (divides num_experts); 0 = off.
  int64_t num_expert_groups = 0;
  /// Node-limited routing: groups a token may use, picked by the sum of each group's top-2 scores.
  int64_t num_limited_groups = 0;
  /// Routed experts through at::_grouped_mm (true) or a per-expert matmul loop (false).
  bool use_grouped_mm = true;
  /// Step of the aux-loss-free expert-bias update; 0 = no expert bias.
  double load_balance_coeff = 1e-3;
  /// Weight (alpha) of DeepSeek-V3's sequence-wise auxiliary balance loss (eqs. 17-20), beside or instead of
  /// the bias balancing: alpha * sum_i f_i P_i per sequence; 0 = off. See MoE::aux_loss_scale.
  double load_balance_loss_weight = 0.0;
  /// The router's gate has a bias, router.gate.bias (E) (torchtitan's gate_bias; gpt-oss).
  bool gate_bias = false;
  /// Every routed expert's projections have biases, experts.{w1,w3}_bias (E, F) and w2_bias (E, D) (gpt-oss).
  bool biased_experts = false;
  /// The routed experts' activation (the shared experts are always a plain SwiGLU).
  ExpertActivation activation = ExpertActivation::swiglu;
  /// clamped_swiglu: the gain inside the sigmoid.
  double swiglu_alpha = 1.702;
  /// clamped_swiglu: the gate is clamped to at most this, the up projection to [-limit, limit].
  double swiglu_limit = 7.0;
};

/// Throws `[titan::nn::MoE] expected X, got Y. fix` for an inconsistent config.
void validate(const MoEArgs& args);

/// One routing decision for T tokens.
struct Routing {
  at::Tensor scores;             // (T, E) fp32: every expert's score, before the bias (the auxiliary loss reads it)
  at::Tensor top_scores;         // (T, K) fp32: combine weights (after route_norm and route_scale)
  at::Tensor selected_experts;   // (T, K) int64: expert of each slot, best first
  at::Tensor tokens_per_expert;  // (E) int64: how many slots chose each expert
};

/// Token-choice top-k router. Scores = score_func(gate(x)) in fp32; the experts are chosen on
/// scores + expert_bias (node-limited first, if configured), and the combine weights are the
/// *unbiased* scores of the chosen experts (DeepSeek-V3: the bias steers selection only).
///
/// Ties: the choice is deterministic on every device. Experts (and groups) are ranked by a stable
/// descending sort, so among equal scores the lower expert (group) index wins.
class TokenChoiceTopKRouter : public torch::nn::Module {
 public:
  TokenChoiceTopKRouter(int64_t dim, const MoEArgs& args, const at::TensorOptions& options);
  /// x (T, D); expert_bias (E) fp32 or undefined.
  Routing forward(const at::Tensor& x, const at::Tensor& expert_bias = {}) const;
  /// gate trunc-normal(init_std), its bias zero (every expert starts level); `site` names this router.
  void init_weights(const InitSite& site, double init_std);

  MoEArgs args;
  std::shared_ptr<Linear> gate;  // weight (E, D), bias (E) with gate_bias
};

/// What the routed experts compute beyond Llama's bias-free SwiGLU: gpt-oss's biases and clamped activation.
struct ExpertsVariant {
  /// Bias of the gate projection w1 (E, F); undefined: none.
  at::Tensor b1{};
  /// Bias of the down projection w2 (E, D); undefined: none.
  at::Tensor b2{};
  /// Bias of the up projection w3 (E, F); undefined: none.
  at::Tensor b3{};
  /// The activation between w1/w3 and w2.
  ExpertActivation activation = ExpertActivation::swiglu;
  /// clamped_swiglu's sigmoid gain.
  double alpha = 1.702;
  /// clamped_swiglu's clamp.
  double limit = 7.0;
};

/// The routed experts, each w2(act(w1 x, w3 x)) (+ biases), with their weights stacked.
class GroupedExperts : public torch::nn::Module {
 public:
  /// num_experts, use_grouped_mm, biased_experts, activation and its constants come from `args`.
  GroupedExperts(int64_t dim, int64_t hidden_dim, const MoEArgs& args, const at::TensorOptions& options);
  /// x (N, D): tokens sorted by expert, tokens_per_expert (E) summing to N -> (N, D).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& tokens_per_expert) const;
  /// w1 trunc-normal(0.02); w2, w3 trunc-normal(init_std) (torchtitan's scheme); biased experts (torchtitan's
  /// gpt-oss) draw every weight and bias from trunc-normal(init_std). `site` names these experts.
  void init_weights(const InitSite& site, double init_std);
  /// The stacked (E, ...) parameters by name, weights then biases: what expert parallelism shards on dim 0.
  std::vector<std::pair<std::string, at::Tensor*>> stacked_parameters();

  int64_t num_experts;
  bool use_grouped_mm;
  ExpertActivation activation;
  double swiglu_alpha;
  double swiglu_limit;
  at::Tensor w1;       // (E, F, D)
  at::Tensor w2;       // (E, D, F)
  at::Tensor w3;       // (E, F, D)
  at::Tensor w1_bias;  // (E, F); undefined without biased experts
  at::Tensor w2_bias;  // (E, D); undefined without biased experts
  at::Tensor w3_bias;  // (E, F); undefined without biased experts
};

/// Routed experts through at::_grouped_mm with offsets = cumsum(tokens_per_expert); x (N, D),
/// w1/w3 (E, F, D), w2 (E, D, F) -> (N, D), with `variant`'s biases and activation. Rows must be 16-byte
/// aligned (D, F multiples of 4 in fp32, 8 in bf16 and on CUDA): a clear error otherwise. On CUDA the GEMMs
/// run in bf16 on expert groups padded to aligned rows (detail::experts_grouped_mm_padded), as torchtitan's;
/// the result is in x's dtype.
at::Tensor experts_grouped_mm(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                              const at::Tensor& tokens_per_expert, const ExpertsVariant& variant = {});
/// The plain ATen reference twin: one matmul chain per expert (syncs the counts to the host).
/// Same arguments and result; bitwise equal to experts_grouped_mm in fp32 on CPU.
at::Tensor experts_loop(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                        const at::Tensor& tokens_per_expert, const ExpertsVariant& variant = {});

namespace detail {

/// Where the tokens of each expert go in a buffer whose expert groups start at multiples of `align` rows
/// (torchtitan's generate_permute_indices, without its device kernel).
struct PaddedExpertGroups {
  at::Tensor rows;          // (N) int64: the padded-buffer row of each token (tokens sorted by expert)
  at::Tensor offsets;       // (E) int32: end row of each expert's padded group (at::_grouped_mm's offs)
  int64_t padded_rows = 0;  // buffer rows P: a bound, N + E * align rounded up to align, so no device sync
};

/// The padded layout of num_tokens tokens sorted by expert; tokens_per_expert (E) must sum to num_tokens.
/// Each group is rounded up to a multiple of align rows; an empty one gets align rows of padding.
PaddedExpertGroups pad_expert_groups(const at::Tensor& tokens_per_expert, int64_t num_tokens, int64_t align);
/// x (N, D) -> (P, D): each token at its padded row, zeros in every other row (differentiable in x).
at::Tensor pad_expert_rows(const at::Tensor& x, const PaddedExpertGroups& groups);
/// The inverse of pad_expert_rows: y (P, D) -> (N, D), the padding rows dropped (differentiable in y).
at::Tensor unpad_expert_rows(const at::Tensor& y, const PaddedExpertGroups& groups);
/// carrier unchanged (an alias) whose backward also gives aux (a scalar) the gradient 1: aux joins the objective
/// wherever carrier's gradient comes from (torchtitan's _AuxLossInjection).
at::Tensor inject_aux_loss(const at::Tensor& carrier, const at::Tensor& aux);
/// experts_grouped_mm's CUDA path on any device: operands cast to dtype, groups padded to 16-byte aligned
/// rows (8 in bf16), the GEMMs on the padded buffer, the padding dropped, the result cast to x's dtype.
at::Tensor experts_grouped_mm_padded(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                                     const at::Tensor& w3, const at::Tensor& tokens_per_expert, at::ScalarType dtype,
                                     const ExpertsVariant& variant = {});

}  // namespace detail

/// DeepSeek-V3's sequence-wise balance loss (eqs. 17-20), summed over the B sequences of a forward:
/// sum_b alpha * sum_i f_bi P_bi with f_bi = E / (K S) * (slots of sequence b routed to expert i) and
/// P_bi = mean over b's S tokens of score_ti / sum_j score_tj. scores (B*S, E) fp32, selected (B*S, K) -> ().
/// Differentiable in scores (f counts choices, which are not).
at::Tensor sequence_balance_loss(const at::Tensor& scores, const at::Tensor& selected, int64_t batch, double alpha);

/// Runs the routed experts somewhere else: what expert parallelism plugs into an MoE layer
/// (titan::parallel::apply_expert_parallel). run() gets the slots sorted by *global* expert and
/// returns their expert outputs in the same order; experts holds this rank's experts only.
class RoutedExpertsDispatch {
 public:
  virtual ~RoutedExpertsDispatch() = default;
  /// x (N, D) sorted by expert, tokens_per_expert (E) int64 (all experts) -> (N, D).
  virtual at::Tensor run(const GroupedExperts& experts, const at::Tensor& x,
                         const at::Tensor& tokens_per_expert) const = 0;
};

/// The MoE layer: router, routed experts, optional shared experts, expert-bias load balancing.
class MoE : public torch::nn::Module {
 public:
  MoE(const MoEArgs& args, int64_t dim, int64_t hidden_dim, const at::TensorOptions& options);
  /// x (B, S, D) -> (B, S, D). Adds this step's counts to tokens_per_expert (a recomputing
  /// activation checkpoint counts twice; the sign in update_expert_bias does not mind). With
  /// load_balance_loss_weight > 0 and grad mode on, the output also carries the auxiliary loss: its backward
  /// adds the gradient of aux_loss_scale * sequence_balance_loss(...) to the router (torchtitan's
  /// _AuxLossInjection), so no loss function changes and pipeline stages need not return it.
  at::Tensor forward(const at::Tensor& x) const;
  /// torchtitan's init: experts, router gate (trunc-normal(init_std)), shared experts; zeroes the
  /// expert bias and the counts. `site` names this layer (each parameter draws by its own name).
  void init_weights(const InitSite& site, double init_std);
  /// Aux-loss-free balancing step (torchtitan's optimizer pre-step hook), outside autograd:
  /// expert_bias += d - mean(d) with d = coeff * sign(mean(load) - load), load = tokens_per_expert;
  /// then zeroes tokens_per_expert. Under data parallelism, all-reduce tokens_per_expert (SUM over
  /// the loss ranks) first. No-op without an expert bias (load_balance_coeff == 0).
  void update_expert_bias(double coeff);

  MoEArgs args;
  std::shared_ptr<TokenChoiceTopKRouter> router;
  std::shared_ptr<GroupedExperts> experts;
  std::shared_ptr<FeedForward> shared_experts;  // null when num_shared_experts == 0
  std::shared_ptr<Linear> shared_gate;          // weight (1, D); null without shared_expert_gate
  at::Tensor expert_bias;                       // (E) fp32 buffer; undefined when load_balance_coeff == 0
  at::Tensor tokens_per_expert;                 // (E) fp32, accumulated by forward; not a checkpointed buffer
  /// The weight of one sequence's auxiliary loss in the objective: 1 (the default) adds the sum over the
  /// forward's sequences; the Trainer sets 1 / (sequences per optimizer step), so the ranks' and microbatches'
  /// injections add up to the mean over the global batch, as the token-mean cross-entropy does.
  double aux_loss_scale = 1.0;
  /// The auxiliary loss this layer injected since the last zeroing (() fp32, aux_loss_scale applied; a
  /// recomputing activation checkpoint injects, and counts, once: its first forward runs without grad).
  at::Tensor aux_loss;
  /// Set by expert parallelism: the routed experts run through it; null = experts->forward here.
  std::shared_ptr<const RoutedExpertsDispatch> dispatch{};
};

}  // namespace titan::nn
