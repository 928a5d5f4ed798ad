// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3/args.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "titan/core/error.hpp"
#include "titan/models/decoder_spec.hpp"

namespace titan::qwen3 {

bool Qwen3Args::is_moe_layer(int64_t layer) const {
  return moe_enabled && (layer + 1) % decoder_sparse_step == 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end();
}

void Qwen3Args::validate() const {
  TITAN_CHECK_VALUE(dim > 0 && n_layers > 0 && vocab_size > 0 && hidden_dim > 0,
                    "[titan::qwen3] expected positive dim, n_layers, vocab_size and hidden_dim, got {}, {}, {}, {}. "
                    "Fix the model arguments.",
                    dim, n_layers, vocab_size, hidden_dim);
  TITAN_CHECK_VALUE(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                    "[titan::qwen3] expected n_heads divisible by n_kv_heads, got n_heads {} and n_kv_heads {}. Pick "
                    "a kv head count dividing the query heads.",
                    n_heads, n_kv_heads);
  TITAN_CHECK_VALUE(head_dim > 0 && head_dim % 2 == 0,
                    "[titan::qwen3] expected an even head_dim (RoPE rotates pairs), got {}. Fix head_dim.", head_dim);
  TITAN_CHECK_VALUE(decoder_sparse_step >= 1,
                    "[titan::qwen3] expected decoder_sparse_step >= 1, got {}. Use 1 for MoE in every layer.",
                    decoder_sparse_step);
  for (const int64_t layer : mlp_only_layers) {
    TITAN_CHECK_VALUE(layer >= 0 && layer < n_layers,
                      "[titan::qwen3] expected mlp_only_layers in [0, {}), got {}. Name existing layers.", n_layers,
                      layer);
  }
  if (!moe_enabled) return;
  TITAN_CHECK_VALUE(moe.top_k >= 1 && moe.top_k <= moe.num_experts,
                    "[titan::qwen3] expected the MoE's top_k (HF num_experts_per_tok) in [1, num_experts = {}], got "
                    "top_k {}. Lower top_k or add experts.",
                    moe.num_experts, moe.top_k);
  TITAN_CHECK_VALUE(moe_inter_dim > 0, "[titan::qwen3] expected moe_inter_dim > 0, got {}. Fix moe_inter_dim.",
                    moe_inter_dim);
  nn::validate(moe);
}

namespace {

// torchtitan's Qwen3-MoE router: softmax over 128 (debug: 64) experts, top-8, renormalised, no shared
// experts, the expert outputs weighted (not the inputs); expert bias for aux-loss-free balancing.
nn::MoEArgs qwen3_moe(int64_t num_experts, int64_t top_k = 8) {
  return {.num_experts = num_experts,
          .num_shared_experts = 0,
          .score_func = "softmax",
          .route_norm = true,
          .route_scale = 1.0,
          .score_before_experts = false,
          .top_k = top_k};
}

const models::FlavorTable<Qwen3Args>& flavors() {
  static const models::FlavorTable<Qwen3Args> table = {
      {"debugmodel",
       {.dim = 256, .n_layers = 8, .n_heads = 16, .n_kv_heads = 8, .vocab_size = 2048, .tie_word_embeddings = true}},
      {"0.6B", {.dim = 1024, .n_layers = 28, .n_heads = 16, .tie_word_embeddings = true}},
      {"1.7B", {.dim = 2048, .n_layers = 28, .n_heads = 16, .hidden_dim = 6144, .tie_word_embeddings = true}},
      {"4B", {.dim = 2560, .n_layers = 36, .n_heads = 32, .hidden_dim = 9728, .tie_word_embeddings = true}},
      {"8B", {.dim = 4096, .n_layers = 36, .n_heads = 32, .hidden_dim = 12288}},
      {"14B", {.dim = 5120, .n_layers = 40, .n_heads = 40, .hidden_dim = 17408}},
      {"32B", {.dim = 5120, .n_layers = 64, .n_heads = 64, .hidden_dim = 25600}},
      {"debugmodel_moe",
       {.dim = 256,
        .n_layers = 8,
        .n_heads = 16,
        .vocab_size = 2048,
        .moe_enabled = true,
        .moe_inter_dim = 768,
        .moe = qwen3_moe(64)}},
      // titan's own (torchtitan has no such flavor): the smallest Qwen3-MoE that every layout splits (4 MoE
      // layers for 2 pipeline stages, 8 experts for ep 2 x efsdp 2, 2 kv heads for tp 2), for the parity tests.
      {"tiny_moe",
       {.dim = 64,
        .n_layers = 4,
        .n_heads = 4,
        .n_kv_heads = 2,
        .vocab_size = 2048,
        .head_dim = 16,
        .hidden_dim = 128,
        .moe_enabled = true,
        .moe_inter_dim = 32,
        .moe = qwen3_moe(8, /*top_k=*/2)}},
      {"30B-A3B",
       {.dim = 2048,
        .n_layers = 48,
        .n_heads = 32,
        .n_kv_heads = 4,
        .hidden_dim = 6144,
        .max_seq_len = 262144,
        .moe_enabled = true,
        .moe_inter_dim = 768,
        .moe = qwen3_moe(128)}},
      {"235B-A22B",
       {.dim = 4096,
        .n_layers = 94,
        .n_heads = 64,
        .n_kv_heads = 4,
        .hidden_dim = 12288,
        .rope_theta = 5000000.0,
        .moe_enabled = true,
        .moe_inter_dim = 1536,
        .moe = qwen3_moe(128)}},
  };
  return table;
}

}  // namespace

std::vector<std::string> flavor_names() { return models::flavor_names(flavors()); }

Qwen3Args flavor(std::string_view name) { return models::find_flavor(flavors(), name, "titan::qwen3"); }

}  // namespace titan::qwen3
