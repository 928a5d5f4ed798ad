// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3_5/model.hpp"
#include "titan/models/detail/family_args.hpp"

#include <algorithm>
#include <cmath>

namespace titan::qwen3_5 {

models::DecoderShape decoder_shape(const Qwen35Args& args) {
  const nn::GatedDeltaNetOptions& l = args.linear;
  models::DecoderShape shape{
      .where = "titan::qwen3_5",
      .vocab_size = args.vocab_size,
      .dim = args.dim,
      .n_layers = args.n_layers,
      .n_heads = args.n_heads,
      .n_kv_heads = args.n_kv_heads,
      .head_dim = args.head_dim,
      .v_head_dim = args.head_dim,
      .norm_eps = args.norm_eps,
      .norm_unit_offset = true,
      .max_seq_len = args.max_seq_len,
      .tied = args.tie_word_embeddings,
      .head_projections = {"wq", "wk", "wv", "wg"},
      .replicated_attention = {"q_norm", "k_norm"},
      .shared_experts = args.moe_enabled,
      .shared_expert_gate = args.moe_enabled,
      // The delta rule's three state products per token and value head (read with k, write k delta^T, read with
      // q), 2 FLOPs a multiply-add, 3x for forward and backward: what the softmax term counts for attention.
      .linear_attention_flops = 18 * l.n_value_heads * l.key_head_dim * l.value_head_dim,
      .moe_top_k = args.moe_enabled ? args.moe.top_k : 0,
      .moe_num_experts = args.moe_enabled ? args.moe.num_experts : 0};
  for (int64_t i = 0; i < args.n_layers; ++i) {
    if (!args.is_full_attention(i)) shape.linear_attention_layers.push_back(i);
    if (args.moe_enabled) shape.moe_layers.push_back(i);
  }
  return shape;
}

namespace {

const Qwen35Args& validated(const Qwen35Args& args) {
  args.validate();
  return args;
}

std::shared_ptr<nn::AttentionLayer> mixer(const Qwen35Args& a, int64_t layer, const at::TensorOptions& options) {
  if (!a.is_full_attention(layer)) {
    nn::GatedDeltaNetOptions linear = a.linear;
    linear.norm_eps = a.norm_eps;
    return std::make_shared<nn::GatedDeltaNet>(a.dim, linear, options);
  }
  return std::make_shared<nn::Attention>(a.dim, a.n_heads, a.n_kv_heads, options,
                                         nn::AttentionOptions{.head_dim = a.head_dim,
                                                              .qk_norm = true,
                                                              .qk_norm_eps = a.norm_eps,
                                                              .qk_norm_unit_offset = true,
                                                              .rotary_dim = a.rotary_dim(),
                                                              .output_gate = true});
}

}  // namespace

Qwen35::Qwen35(const Qwen35Args& args, int64_t seq_len, const at::TensorOptions& options,
               const std::vector<std::string>& modules)
    : Decoder(decoder_shape(validated(args)), seq_len, options, modules,
              [&](int64_t layer) {
                const double depth =
                    args.depth_init ? static_cast<double>(layer + 1) : static_cast<double>(args.n_layers);
                models::DecoderBlock::Parts parts{.attention = mixer(args, layer, options),
                                                  .init_std = 0.02 / std::sqrt(2.0 * depth)};
                if (args.moe_enabled) {
                  parts.moe = std::make_shared<nn::MoE>(args.moe, args.dim, args.moe_inter_dim, options);
                } else {
                  parts.feed_forward = std::make_shared<nn::FeedForward>(args.dim, args.hidden_dim, options);
                }
                return parts;
              }),
      args_(args) {
  if (options.device().type() != at::kMeta) {
    // RoPE tables are derived, not parameters: rebuilt on the model's device, never checkpointed. They cover the
    // rotated quarter of a head.
    set_rope(nn::make_rope_tables(
        {.head_dim = args.rotary_dim(), .max_positions = seq_len, .theta = args.rope_theta, .llama3_scaling = false},
        options.device()));
  }
}

namespace {

// A Gated DeltaNet block's tensor-parallel roles inside its attention module: every per-head tensor split over the
// heads (the projections' rows, the convolutions' channels, the decay rates), wo rowwise, the per-head output norm
// whole.
void linear_attention_roles(std::vector<std::pair<std::string, parallel::TensorParallelRole>>& roles,
                            const std::string& attention) {
  using Role = parallel::TensorParallelRole;
  auto first =
      std::find_if(roles.begin(), roles.end(), [&](const auto& r) { return r.first.starts_with(attention + "."); });
  const auto end =
      std::find_if(first, roles.end(), [&](const auto& r) { return !r.first.starts_with(attention + "."); });
  first = roles.erase(first, end);
  std::vector<std::pair<std::string, Role>> mine;
  for (const char* w : {"wq", "wk", "wv", "conv_q", "conv_k", "conv_v", "wz", "wb", "wa", "decay"}) {
    mine.emplace_back(attention + "." + w, Role::colwise);
  }
  mine.emplace_back(attention + ".norm", Role::replicated);
  mine.emplace_back(attention + ".wo", Role::rowwise);
  roles.insert(first, mine.begin(), mine.end());
}

}  // namespace

parallel::ShardingSpec Qwen35::sharding_spec() const {
  parallel::ShardingSpec spec = Decoder::sharding_spec();
  for (const int64_t i : shape().linear_attention_layers) {
    linear_attention_roles(spec.tensor_parallel, "layers." + std::to_string(i) + ".attention");
  }
  spec.tensor_parallel_divides.emplace_back("linear_num_key_heads", args_.linear.n_key_heads);
  spec.tensor_parallel_divides.emplace_back("linear_num_value_heads", args_.linear.n_value_heads);
  // Beside the skeleton's refusal of a tied flavor's pipeline (its first and last stage would share the embedding).
  spec.refused.push_back(
      {"cp_load_balance",
       "the Gated DeltaNet blocks pass their recurrent state from each cp rank to the next, so each rank holds one "
       "contiguous part of the sequence (docs/qwen3_5.md). Set parallelism.context_parallel_load_balancer None."});
  return spec;
}

std::shared_ptr<Qwen35> Qwen35::build(const Qwen35Args& args, const ModelBuild& where) {
  return models::detail::build_family<Qwen35>(args, where);
}

// The planner's memory model: one term per tensor autograd keeps in nn::GatedDeltaNet's forward
// (src/nn/gated_deltanet.cpp, src/nn/gated_delta_rule.cpp), checked against the memory tracker on CPU
// (tests/models/qwen3_5_test.cpp); the full-attention blocks are nn::Attention's with the output gate.
namespace {

models::AttentionMemory gated_deltanet_memory(const nn::GatedDeltaNet& layer, const models::ActivationShapes& x) {
  const nn::GatedDeltaNetOptions& o = layer.options;
  const int64_t T = x.tokens();
  const int64_t a = x.bytes;
  const int64_t K = o.conv_kernel;
  const int64_t dk = o.key_head_dim;
  const int64_t dv = o.value_head_dim;
  const int64_t Hk = o.n_key_heads / x.tp;  // heads on this rank
  const int64_t H = o.n_value_heads / x.tp;
  const int64_t D = layer.wq->weight.size(1);
  const int64_t Ck = Hk * dk;  // q or k channels
  const int64_t Cv = H * dv;   // v channels
  const int64_t chunks = (x.s + o.chunk_size - 1) / o.chunk_size;
  const int64_t Tp = x.b * chunks * o.chunk_size;  // tokens padded to whole chunks
  const int64_t C = o.chunk_size;
  int64_t saved = 0;
  // Around the rule: beta's sigmoid output, the decay's softplus input and output and its rates exp(A) (fp32), the
  // gate's fp32 input.
  saved += T * H * a + 2 * T * H * 4 + 2 * H * 4 + T * Cv * 4;
  // Each convolution keeps its zero-padded (or carried) input, K-1 more tokens per row, and SiLU its input.
  for (const int64_t channels : {Ck, Ck, Cv}) saved += (T + x.b * (K - 1)) * channels * a + T * channels * a;
  // q and k L2-normalised in fp32: the input and the inverse norm per head.
  saved += 2 * (T * Ck * 4 + T * Hk * 4);
  // The chunked rule, per value head over the padded tokens, fp32: q, k, v, beta, k beta, the decays from the chunk's
  // start and to its end; (C, C) per chunk: the decay matrix, k k^T, the triangular system, q k^T and the masked
  // product; the solves' outputs (the deltas' value part and the state reads), q and k decayed, the deltas.
  saved += Tp * H * (2 * dk + dv + 1) * 4 + Tp * H * dk * 4 + 2 * Tp * H * 4;
  saved += 5 * Tp * H * C * 4 + C * C;  // and the causal mask (C, C), bool
  saved += Tp * H * (dv + dk) * 4 + 2 * Tp * H * dk * 4 + Tp * H * dv * 4;
  // The state entering each chunk (the first: zeros, or under cp the previous rank's), (B, H, dk, dv) fp32 each.
  saved += chunks * x.b * H * dk * dv * 4;
  // Under cp the received message stays whole while its state is kept: the three convolutions' K-1 carried inputs.
  if (x.cp > 1) saved += x.b * (K - 1) * (2 * Ck + Cv) * 4;
  // The per-head output norm, its fp32 output and the gate's SiLU output (the product's operands), wo's input. In fp32
  // the norm reads a view of the rule's whole padded output, which it keeps.
  saved += models::rms_norm_saved(T * H, dv, x) + 2 * T * Cv * 4 + T * Cv * a + (a == 4 ? (Tp - T) * Cv * 4 : 0);
  return {.saved = saved,
          .attention_out = 0,  // per-operator checkpointing recomputes the rule
          .gathered_kv = 0,
          .matmuls = {{T, D, Ck}, {T, D, Ck}, {T, D, Cv}, {T, D, Cv}, {T, D, H}, {T, D, H}, {T, Cv, D}}};
}

}  // namespace

models::AttentionMemory attention_memory(const nn::AttentionLayer& layer, const models::ActivationShapes& x) {
  if (const auto* linear = dynamic_cast<const nn::GatedDeltaNet*>(&layer)) return gated_deltanet_memory(*linear, x);
  models::AttentionMemory m = models::nn_attention_memory(layer, x);
  const auto& attention = dynamic_cast<const nn::Attention&>(layer);
  if (attention.wg) {
    // attn * sigmoid(wg x): the sigmoid's output and the product wo reads.
    const int64_t T = x.tokens();
    const int64_t width = attention.wg->weight.size(0) / x.tp;
    m.saved += 2 * T * width * x.bytes;
    m.matmuls.insert(m.matmuls.end() - 1, {T, attention.wg->weight.size(1), width});
  }
  return m;
}

}  // namespace titan::qwen3_5
