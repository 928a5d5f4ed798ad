// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/llama3/args.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "titan/core/error.hpp"
#include "titan/models/decoder_spec.hpp"

namespace titan::llama3 {

int64_t Llama3Args::ffn_hidden_dim() const {
  // Python int() truncation at each step, as in torchtitan's FeedForward.
  int64_t hidden = 4 * dim;
  hidden = static_cast<int64_t>(2 * hidden / 3);
  if (ffn_dim_multiplier) hidden = static_cast<int64_t>(*ffn_dim_multiplier * static_cast<double>(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

namespace {
const models::FlavorTable<Llama3Args>& flavors() {
  static const models::FlavorTable<Llama3Args> table = {
      {"debugmodel", {.dim = 256, .n_layers = 6, .n_heads = 16, .vocab_size = 2048, .rope_theta = 500000}},
      // titan-only: a ~100M model (98.0M parameters) for CPU benchmarks between debugmodel and 1B.
      {"100M", {.dim = 640, .n_layers = 12, .n_heads = 10, .n_kv_heads = 5, .vocab_size = 32768, .rope_theta = 500000}},
      {"1B",
       {.dim = 2048,
        .n_layers = 16,
        .n_heads = 32,
        .n_kv_heads = 8,
        .multiple_of = 1024,
        .ffn_dim_multiplier = 1.5,
        .rope_theta = 500000,
        .tie_word_embeddings = true}},
      {"3B",
       {.dim = 3072,
        .n_layers = 28,
        .n_heads = 24,
        .n_kv_heads = 8,
        .multiple_of = 1024,
        .ffn_dim_multiplier = 1.0,
        .rope_theta = 500000,
        .tie_word_embeddings = true}},
      {"8B",
       {.dim = 4096,
        .n_layers = 32,
        .n_heads = 32,
        .n_kv_heads = 8,
        .multiple_of = 1024,
        .ffn_dim_multiplier = 1.3,
        .rope_theta = 500000}},
      {"70B",
       {.dim = 8192,
        .n_layers = 80,
        .n_heads = 64,
        .n_kv_heads = 8,
        .multiple_of = 4096,
        .ffn_dim_multiplier = 1.3,
        .rope_theta = 500000}},
      {"405B",
       {.dim = 16384,
        .n_layers = 126,
        .n_heads = 128,
        .n_kv_heads = 8,
        .multiple_of = 4096,
        .ffn_dim_multiplier = 1.2,
        .rope_theta = 500000}},
  };
  return table;
}
}  // namespace

std::vector<std::string> flavor_names() { return models::flavor_names(flavors()); }

Llama3Args flavor(std::string_view name) { return models::find_flavor(flavors(), name, "titan::llama3"); }

}  // namespace titan::llama3
