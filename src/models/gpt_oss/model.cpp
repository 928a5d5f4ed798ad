// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/gpt_oss/model.hpp"
#include "titan/models/detail/family_args.hpp"

#include <cmath>

#include "titan/core/error.hpp"

namespace titan::gpt_oss {

models::DecoderShape decoder_shape(const GptOssArgs& args) {
  models::DecoderShape shape{.where = "titan::gpt_oss",
                             .vocab_size = args.vocab_size,
                             .dim = args.dim,
                             .n_layers = args.n_layers,
                             .n_heads = args.n_heads,
                             .n_kv_heads = args.n_kv_heads,
                             .head_dim = args.head_dim,
                             .v_head_dim = args.head_dim,
                             .norm_eps = args.norm_eps,
                             .max_seq_len = args.max_seq_len,
                             .shared_experts = false,
                             .moe_top_k = args.moe.top_k,
                             .moe_num_experts = args.moe.num_experts,
                             .pipeline_and_context_parallel = false,
                             .tensor_parallel = false};
  for (int64_t i = 0; i < args.n_layers; ++i) shape.moe_layers.push_back(i);
  return shape;
}

namespace {

const GptOssArgs& validated(const GptOssArgs& args) {
  args.validate();
  return args;
}

// YaRN as gpt-oss uses it (HF's truncate = false, torchtitan's precompute_rope_cache): the ramp's ends
// stay fractional (unless rope_truncate), and cos and sin carry the attention temperature, so q.k is
// scaled by its square.
nn::RopeTables rope_tables(const GptOssArgs& a, int64_t seq_len, const at::Device& device) {
  if (a.rope_factor <= 1.0) {
    return nn::make_rope_tables(
        {.head_dim = a.head_dim, .max_positions = seq_len, .theta = a.rope_theta, .llama3_scaling = false}, device);
  }
  const at::Tensor freqs = nn::yarn_frequencies({.head_dim = a.head_dim,
                                                 .theta = a.rope_theta,
                                                 .factor = a.rope_factor,
                                                 .original_max_positions = a.original_seq_len,
                                                 .beta_fast = a.beta_fast,
                                                 .beta_slow = a.beta_slow,
                                                 .truncate = a.rope_truncate});  // (HD/2)
  return nn::make_rope_tables(freqs, seq_len, device, nn::yarn_mscale(a.rope_factor, 1.0));
}

}  // namespace

GptOss::GptOss(const GptOssArgs& args, int64_t seq_len, const at::TensorOptions& options,
               const std::vector<std::string>& modules)
    : Decoder(decoder_shape(validated(args)), seq_len, options, modules,
              [&](int64_t layer) {
                const nn::AttentionOptions attention{
                    .head_dim = args.head_dim,
                    .bias = true,
                    .sinks = true,
                    .sliding_window = GptOssArgs::is_sliding_layer(layer) ? args.sliding_window : 0};
                return models::DecoderBlock::Parts{
                    .attention =
                        std::make_shared<nn::Attention>(args.dim, args.n_heads, args.n_kv_heads, options, attention),
                    .moe = std::make_shared<nn::MoE>(args.moe, args.dim, args.moe_inter_dim, options),
                    // torchtitan's gpt-oss depth init.
                    .init_std = 0.02 / std::sqrt(2.0 * static_cast<double>(layer + 1))};
              }),
      args_(args) {
  // RoPE tables are derived, not parameters: rebuilt on the model's device, never checkpointed.
  if (options.device().type() != at::kMeta) set_rope(rope_tables(args, seq_len, options.device()));
}

parallel::ShardingSpec GptOss::sharding_spec() const {
  parallel::ShardingSpec spec = Decoder::sharding_spec();
  for (parallel::RefusedAxis& r : spec.refused) {
    if (r.axis == "cp") {
      r.axis = "cp_kv";  // Ulysses attends whole sequences of a head subset: sinks and window as on one device
      r.reason =
          "the attention sinks and the sliding window are built into the Ulysses context-parallel attention only. "
          "Set parallelism.context_parallel_rotate_method ulysses, or parallelism.context_parallel_degree 1.";
    } else if (r.axis == "tp") {
      r.reason =
          "tensor parallelism of the biased q/k/v/o projections and the per-head sinks is not built. Use "
          "data and expert parallelism (parallelism.data_parallel_shard_degree, expert_parallel_degree).";
    }
  }
  return spec;
}

std::shared_ptr<GptOss> GptOss::build(const GptOssArgs& args, const ModelBuild& where) {
  return models::detail::build_family<GptOss>(args, where);
}

}  // namespace titan::gpt_oss
