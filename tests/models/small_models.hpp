// SPDX-License-Identifier: BSD-3-Clause
// The tests' smallest Llama 3 and Qwen3-MoE (vocabulary 128): seconds per run on 2 cores, every path a layout splits.
#pragma once

#include "titan/models/llama3/args.hpp"
#include "titan/models/qwen3/args.hpp"

namespace titan::test {

/// Llama 3's debug flavor cut to 2 blocks of width 64 (4 heads).
inline llama3::Llama3Args small_llama3() {
  llama3::Llama3Args args = llama3::flavor("debugmodel");
  args.vocab_size = 128;
  args.dim = 64;
  args.n_heads = 4;
  args.n_layers = 2;
  return args;
}

/// Qwen3-MoE with two MoE blocks of 4 routed experts (top 2, softmax, renormalised) around a dense one.
inline qwen3::Qwen3Args small_qwen3_moe() {
  return {.dim = 64,
          .n_layers = 3,
          .n_heads = 4,
          .n_kv_heads = 2,
          .vocab_size = 128,
          .head_dim = 16,
          .hidden_dim = 96,
          .moe_enabled = true,
          .moe_inter_dim = 32,
          .moe = {.num_experts = 4,
                  .num_shared_experts = 0,
                  .score_func = "softmax",
                  .route_norm = true,
                  .score_before_experts = false,
                  .top_k = 2},
          .mlp_only_layers = {1}};
}

}  // namespace titan::test
