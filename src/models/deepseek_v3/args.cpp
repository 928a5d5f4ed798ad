// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/deepseek_v3/args.hpp"

#include "titan/models/decoder_spec.hpp"
#include "titan/nn/rope.hpp"

namespace titan::deepseek_v3 {

double DeepSeekV3Args::softmax_mscale(int64_t seq_len) const {
  if (!uses_yarn(seq_len)) return 1.0;
  const double m = nn::yarn_mscale(rope_factor, mscale);
  return m * m;
}

namespace {
// debugmodel's routing, which tiny keeps: 8 experts (2 shared), softmax scores, top 3. A function, not a
// global: the flavor table may be built during another file's static initialisation.
nn::MoEArgs debug_routing() {
  return {.num_experts = 8,
          .num_shared_experts = 2,
          .score_func = "softmax",
          .route_norm = false,
          .score_before_experts = false,
          .top_k = 3};
}

const models::FlavorTable<DeepSeekV3Args>& flavors() {
  // torchtitan 0.2.2's deepseekv3_args; its MLA dims (kv_lora_rank 512, qk 128 + 64, v 128) are the defaults.
  static const models::FlavorTable<DeepSeekV3Args> table = {
      {"debugmodel",
       {.dim = 256,
        .n_layers = 6,
        .n_dense_layers = 1,
        .n_heads = 16,
        .vocab_size = 2048,
        .inter_dim = 1024,
        .moe_inter_dim = 256,
        .moe = debug_routing(),
        .mscale = 0.70}},
      // titan's own: the smallest model on every DeepSeek-V3 path (a dense layer, MoE layers with shared
      // experts, MLA with a latent and a rope part), for parity tests on small machines.
      {"tiny",
       {.dim = 64,
        .n_layers = 3,
        .n_dense_layers = 1,
        .n_heads = 4,
        .vocab_size = 2048,
        .inter_dim = 128,
        .moe_inter_dim = 64,
        .moe = debug_routing(),
        .kv_lora_rank = 32,
        .qk_nope_head_dim = 16,
        .qk_rope_head_dim = 8,
        .v_head_dim = 16,
        .mscale = 0.70}},
      {"16B",
       {.dim = 2048,
        .n_layers = 27,
        .n_dense_layers = 1,
        .n_heads = 16,
        .vocab_size = 102400,
        .inter_dim = 10944,
        .moe_inter_dim = 1408,
        .moe = {.num_experts = 64,
                .num_shared_experts = 2,
                .score_func = "softmax",
                .route_norm = false,
                .score_before_experts = false,
                .top_k = 6},
        .mscale = 0.70}},
      {"236B",
       {.dim = 5120,
        .n_layers = 60,
        .n_dense_layers = 1,
        .n_heads = 128,
        .vocab_size = 102400,
        .inter_dim = 12288,
        .moe_inter_dim = 1536,
        .moe = {.num_experts = 160,
                .num_shared_experts = 2,
                .score_func = "softmax",
                .route_norm = false,
                .route_scale = 16.0,
                .score_before_experts = false,
                .top_k = 6,
                .num_expert_groups = 8,
                .num_limited_groups = 3},
        .q_lora_rank = 1536}},
      {"671B",
       {.dim = 7168,
        .n_layers = 61,
        .n_dense_layers = 3,
        .n_heads = 128,
        .vocab_size = 129280,
        .inter_dim = 18432,
        .moe_inter_dim = 2048,
        .moe = {.num_experts = 256,
                .num_shared_experts = 1,
                .score_func = "sigmoid",
                .route_norm = true,
                .route_scale = 2.5,
                .score_before_experts = false,
                .top_k = 8,
                .num_expert_groups = 8,
                .num_limited_groups = 4},
        .q_lora_rank = 1536}},
  };
  return table;
}
}  // namespace

std::vector<std::string> flavor_names() { return models::flavor_names(flavors()); }

DeepSeekV3Args flavor(std::string_view name) { return models::find_flavor(flavors(), name, "titan::deepseek_v3"); }

}  // namespace titan::deepseek_v3
