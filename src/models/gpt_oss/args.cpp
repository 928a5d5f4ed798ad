// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/gpt_oss/args.hpp"

#include "titan/core/error.hpp"
#include "titan/models/decoder_spec.hpp"

namespace titan::gpt_oss {

nn::MoEArgs gpt_oss_moe(int64_t num_experts) {
  return {.num_experts = num_experts,
          .num_shared_experts = 0,
          .score_func = "softmax",
          .route_norm = true,
          .route_scale = 1.0,
          .score_before_experts = false,
          .top_k = 4,
          .load_balance_coeff = 1e-3,
          .gate_bias = true,
          .biased_experts = true,
          .activation = nn::ExpertActivation::clamped_swiglu};
}

void GptOssArgs::validate() const {
  TITAN_CHECK_VALUE(dim > 0 && n_layers > 0 && vocab_size > 0 && moe_inter_dim > 0,
                    "[titan::gpt_oss] expected positive dim, n_layers, vocab_size and moe_inter_dim, got {}, {}, {}, "
                    "{}. Fix the model arguments.",
                    dim, n_layers, vocab_size, moe_inter_dim);
  TITAN_CHECK_VALUE(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                    "[titan::gpt_oss] expected n_heads divisible by n_kv_heads, got n_heads {} and n_kv_heads {}. "
                    "Pick a kv head count dividing the query heads.",
                    n_heads, n_kv_heads);
  TITAN_CHECK_VALUE(head_dim > 0 && head_dim % 2 == 0,
                    "[titan::gpt_oss] expected an even head_dim (RoPE rotates pairs), got {}. Fix head_dim.", head_dim);
  TITAN_CHECK_VALUE(sliding_window >= 1,
                    "[titan::gpt_oss] expected sliding_window >= 1 (the query itself counts), got {}. gpt-oss uses "
                    "128.",
                    sliding_window);
  TITAN_CHECK_VALUE(rope_factor >= 1.0 && original_seq_len > 0,
                    "[titan::gpt_oss] expected rope_factor >= 1 (1: no YaRN) and original_seq_len > 0, got {} and "
                    "{}. gpt-oss uses 32 and 4096.",
                    rope_factor, original_seq_len);
  TITAN_CHECK_VALUE(moe.top_k >= 1 && moe.top_k <= moe.num_experts,
                    "[titan::gpt_oss] expected the MoE's top_k (HF num_experts_per_tok) in [1, num_experts = {}], got "
                    "top_k {}. Lower top_k or add experts.",
                    moe.num_experts, moe.top_k);
  nn::validate(moe);
}

namespace {

const models::FlavorTable<GptOssArgs>& flavors() {
  // torchtitan's 20b and 120b; its debugmodel keeps the 201088-token vocabulary and 64 heads, titan's
  // shrinks them (and the experts) so a CPU step takes a moment.
  static const models::FlavorTable<GptOssArgs> table = {
      {"debugmodel",
       {.dim = 256,
        .n_layers = 4,
        .n_heads = 8,
        .n_kv_heads = 2,
        .vocab_size = 2048,
        .moe_inter_dim = 512,
        .moe = gpt_oss_moe(8)}},
      {"20b", {.n_layers = 24, .moe = gpt_oss_moe(32)}},
      {"120b", {.n_layers = 36, .moe = gpt_oss_moe(128)}},
  };
  return table;
}

}  // namespace

std::vector<std::string> flavor_names() { return models::flavor_names(flavors()); }

GptOssArgs flavor(std::string_view name) { return models::find_flavor(flavors(), name, "titan::gpt_oss"); }

}  // namespace titan::gpt_oss
