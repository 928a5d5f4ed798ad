// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3_5/args.hpp"

#include <cmath>

#include "titan/core/error.hpp"
#include "titan/models/decoder_spec.hpp"

namespace titan::qwen3_5 {

nn::MoEArgs qwen3_5_moe(int64_t num_experts, int64_t top_k, int64_t shared_dim) {
  return {.num_experts = num_experts,
          .num_shared_experts = 1,
          .shared_expert_dim = shared_dim,
          .shared_expert_gate = true,
          .score_func = "softmax",
          .route_norm = true,
          .route_scale = 1.0,
          .score_before_experts = false,
          .top_k = top_k};
}

bool Qwen35Args::is_full_attention(int64_t layer) const {
  if (!layer_types.empty()) return layer_types.at(static_cast<size_t>(layer)) == "full_attention";
  return (layer + 1) % full_attention_interval == 0;
}

int64_t Qwen35Args::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

void Qwen35Args::validate() const {
  TITAN_CHECK_VALUE(dim > 0 && n_layers > 0 && vocab_size > 0 && (moe_enabled || hidden_dim > 0),
                    "[titan::qwen3_5] expected positive dim, n_layers, vocab_size and (dense) hidden_dim, got {}, {}, "
                    "{}, {}. Fix the model arguments.",
                    dim, n_layers, vocab_size, hidden_dim);
  TITAN_CHECK_VALUE(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
                    "[titan::qwen3_5] expected n_heads divisible by n_kv_heads, got n_heads {} and n_kv_heads {}. Pick "
                    "a kv head count dividing the query heads.",
                    n_heads, n_kv_heads);
  TITAN_CHECK_VALUE(rotary_dim() >= 2 && rotary_dim() % 2 == 0 && rotary_dim() <= head_dim,
                    "[titan::qwen3_5] expected head_dim * partial_rotary_factor even and in [2, head_dim], got "
                    "head_dim {} and partial_rotary_factor {}. Fix them (Qwen3.5: 256 and 0.25).",
                    head_dim, partial_rotary_factor);
  TITAN_CHECK_VALUE(
      layer_types.empty() ? full_attention_interval >= 1 : static_cast<int64_t>(layer_types.size()) == n_layers,
      "[titan::qwen3_5] expected layer_types of n_layers = {} entries or full_attention_interval >= 1, "
      "got {} entries and interval {}. Give one kind per block.",
      n_layers, layer_types.size(), full_attention_interval);
  for (const std::string& kind : layer_types) {
    TITAN_CHECK_VALUE(kind == "full_attention" || kind == "linear_attention",
                      "[titan::qwen3_5] expected layer_types entries full_attention or linear_attention, got '{}'.",
                      kind);
  }
  TITAN_CHECK_VALUE(linear.n_key_heads > 0 && linear.n_value_heads % linear.n_key_heads == 0,
                    "[titan::qwen3_5] expected linear_num_value_heads a multiple of linear_num_key_heads, got {} and "
                    "{}. Fix the linear attention's heads.",
                    linear.n_value_heads, linear.n_key_heads);
  if (!moe_enabled) return;
  TITAN_CHECK_VALUE(moe.top_k >= 1 && moe.top_k <= moe.num_experts && moe_inter_dim > 0,
                    "[titan::qwen3_5] expected the MoE's top_k in [1, num_experts = {}] and moe_inter_dim > 0, got "
                    "top_k {} and moe_inter_dim {}. Fix the MoE arguments.",
                    moe.num_experts, moe.top_k, moe_inter_dim);
  nn::validate(moe);
}

namespace {

// The published sizes: text_config of Qwen/Qwen3.5-{0.8B, 9B, 27B, 35B-A3B}'s config.json. Every one has
// dk = dv = 128, a 4-tap convolution, head_dim 256, RoPE on a quarter of it with base 1e7, and full attention in
// every fourth block.
nn::GatedDeltaNetOptions linear_heads(int64_t key_heads, int64_t value_heads, int64_t head_dim = 128) {
  return {.n_key_heads = key_heads, .n_value_heads = value_heads, .key_head_dim = head_dim, .value_head_dim = head_dim};
}

const models::FlavorTable<Qwen35Args>& dense_flavors() {
  static const models::FlavorTable<Qwen35Args> table = {
      {"debugmodel",
       {.dim = 256,
        .n_layers = 8,
        .n_heads = 8,
        .n_kv_heads = 2,
        .head_dim = 64,
        .vocab_size = 2048,
        .hidden_dim = 768,
        .max_seq_len = 4096,
        .linear = linear_heads(4, 8, 32)}},
      {"0.8B", {.linear = linear_heads(16, 16)}},
      {"9B",
       {.dim = 4096,
        .n_layers = 32,
        .n_heads = 16,
        .n_kv_heads = 4,
        .hidden_dim = 12288,
        .linear = linear_heads(16, 32),
        .tie_word_embeddings = false}},
      {"27B",
       {.dim = 5120,
        .n_layers = 64,
        .n_heads = 24,
        .n_kv_heads = 4,
        .hidden_dim = 17408,
        .linear = linear_heads(16, 48),
        .tie_word_embeddings = false}},
  };
  return table;
}

const models::FlavorTable<Qwen35Args>& moe_flavors() {
  static const models::FlavorTable<Qwen35Args> table = {
      {"debugmodel_moe",
       {.dim = 256,
        .n_layers = 8,
        .n_heads = 8,
        .n_kv_heads = 2,
        .head_dim = 64,
        .vocab_size = 2048,
        .max_seq_len = 4096,
        .linear = linear_heads(4, 8, 32),
        .tie_word_embeddings = false,
        .moe_enabled = true,
        .moe_inter_dim = 128,
        .moe = qwen3_5_moe(8, 2, 128)}},
      {"35B-A3B",
       {.dim = 2048,
        .n_layers = 40,
        .n_heads = 16,
        .n_kv_heads = 2,
        .linear = linear_heads(16, 32),
        .tie_word_embeddings = false,
        .moe_enabled = true,
        .moe_inter_dim = 512,
        .moe = qwen3_5_moe(256, 8, 512)}},
  };
  return table;
}

}  // namespace

std::vector<std::string> flavor_names() { return models::flavor_names(dense_flavors()); }

Qwen35Args flavor(std::string_view name) { return models::find_flavor(dense_flavors(), name, "titan::qwen3_5"); }

std::vector<std::string> moe_flavor_names() { return models::flavor_names(moe_flavors()); }

Qwen35Args moe_flavor(std::string_view name) { return models::find_flavor(moe_flavors(), name, "titan::qwen3_5_moe"); }

}  // namespace titan::qwen3_5
