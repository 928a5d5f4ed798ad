// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3/model.hpp"
#include "titan/models/detail/family_args.hpp"

#include <cmath>

namespace titan::qwen3 {

models::DecoderShape decoder_shape(const Qwen3Args& args) {
  models::DecoderShape shape{
      .where = "titan::qwen3",
      .vocab_size = args.vocab_size,
      .dim = args.dim,
      .n_layers = args.n_layers,
      .n_heads = args.n_heads,
      .n_kv_heads = args.n_kv_heads,
      .head_dim = args.head_dim,
      .v_head_dim = args.head_dim,
      .norm_eps = args.norm_eps,
      .max_seq_len = args.max_seq_len,
      .tied = args.tie_word_embeddings,
      .replicated_attention = args.qk_norm ? std::vector<std::string>{"q_norm", "k_norm"} : std::vector<std::string>{},
      .shared_experts = args.moe.num_shared_experts > 0,
      .moe_top_k = args.moe_enabled ? args.moe.top_k : 0,
      .moe_num_experts = args.moe_enabled ? args.moe.num_experts : 0};
  for (int64_t i = 0; i < args.n_layers; ++i) {
    if (args.is_moe_layer(i)) shape.moe_layers.push_back(i);
  }
  return shape;
}

namespace {
const Qwen3Args& validated(const Qwen3Args& args) {
  args.validate();
  return args;
}
}  // namespace

Qwen3::Qwen3(const Qwen3Args& args, int64_t seq_len, const at::TensorOptions& options,
             const std::vector<std::string>& modules)
    : Decoder(decoder_shape(validated(args)), seq_len, options, modules,
              [&](int64_t layer) {
                const double depth =
                    args.depth_init ? static_cast<double>(layer + 1) : static_cast<double>(args.n_layers);
                models::DecoderBlock::Parts parts{
                    .attention = std::make_shared<nn::Attention>(
                        args.dim, args.n_heads, args.n_kv_heads, options,
                        nn::AttentionOptions{
                            .head_dim = args.head_dim, .qk_norm = args.qk_norm, .qk_norm_eps = args.norm_eps}),
                    .init_std = 0.02 / std::sqrt(2.0 * depth)};
                if (args.is_moe_layer(layer)) {
                  parts.moe = std::make_shared<nn::MoE>(args.moe, args.dim, args.moe_inter_dim, options);
                } else {
                  parts.feed_forward = std::make_shared<nn::FeedForward>(args.dim, args.hidden_dim, options);
                }
                return parts;
              }),
      args_(args) {
  if (options.device().type() != at::kMeta) {
    // RoPE tables are derived, not parameters: rebuilt on the model's device, never checkpointed.
    set_rope(nn::make_rope_tables(
        {.head_dim = args.head_dim, .max_positions = seq_len, .theta = args.rope_theta, .llama3_scaling = false},
        options.device()));
  }
}

std::shared_ptr<Qwen3> Qwen3::build(const Qwen3Args& args, const ModelBuild& where) {
  return models::detail::build_family<Qwen3>(args, where);
}

}  // namespace titan::qwen3
