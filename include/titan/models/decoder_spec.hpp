// SPDX-License-Identifier: BSD-3-Clause
// What every bundled decoder-only model (Llama 3, Qwen3, ...) shares around its blocks: flavor tables, the
// model parts a pipeline rank builds (top-level paths tok_embeddings, layers.N, norm, output), parameters without
// duplicates, parameter groups and pipeline costs, and the sharding spec a decoder declares from its shape.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "titan/models/decoder_shape.hpp"
#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/parallel/plan.hpp"
#include "titan/parallel/sharding_spec.hpp"

namespace titan::models {

/// A model's named flavors (torchtitan's table: name -> arguments), in name order.
template <class Args>
using FlavorTable = std::map<std::string, Args, std::less<>>;

/// The names in a flavor table, sorted.
template <class Args>
std::vector<std::string> flavor_names(const FlavorTable<Args>& table) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.push_back(entry.first);
  return names;
}

/// Throws ConfigError on model.flavor: "[where] expected model.flavor to be one of [known], got 'name'".
[[noreturn]] void unknown_flavor(const std::vector<std::string>& known, std::string_view name, const char* where);

/// The arguments of flavor `name`, or unknown_flavor's error.
template <class Args>
Args find_flavor(const FlavorTable<Args>& table, std::string_view name, const char* where) {
  const auto it = table.find(name);
  if (it == table.end()) unknown_flavor(flavor_names(table), name, where);
  return it->second;
}

/// Which top-level modules a model part holds; an empty list means the whole model. The constructor
/// checks the names (tok_embeddings, layers.0 .. layers.{n_layers-1}, norm, output unless tied) and
/// refuses a part of a tied model (the first and last stage would share a weight).
class ModelParts {
 public:
  /// `where` prefixes the errors ("titan::llama3").
  ModelParts(const std::vector<std::string>& modules, int64_t n_layers, bool tied, const char* where);
  /// Whether the part holds the top-level module `path`.
  bool holds(const std::string& path) const;
  /// N of "layers.N", or -1 for any other path.
  static int64_t layer_index(const std::string& path);

 private:
  std::vector<std::string> modules_;
};

/// The sharding spec of a decoder of `shape`, as torchtitan's parallelize.py shards its families: FSDP units
/// tok_embeddings, each block (an MoE block as two: its attention, norms, router and shared experts, then its routed
/// experts `layers.N.moe.experts`), norm (+ output); tensor-parallel roles: the embedding vocab-parallel, per block
/// the norms sequence_norm, `attention` and a dense `feed_forward` module_input, the head projections colwise, wo
/// rowwise, the replicated attention modules replicated, w1/w3 colwise and w2 rowwise; norm sequence_norm; output
/// head; tp must divide n_heads and n_kv_heads. Every block's attention for CP, every `moe` for EP, every block for
/// AC; the pipeline cuts after tok_embeddings, between blocks and before norm + output; tied embeddings named;
/// pp / cp / tp refused where the shape says so. No pipeline costs (Decoder::sharding_spec adds them).
parallel::ShardingSpec decoder_sharding_spec(const DecoderShape& shape);

/// Parameters of `model` without duplicates (a tied tensor once), in registration order.
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& model);

/// Parameter counts by role, as torchtitan's get_moe_model_nparams_and_flops groups them by name.
struct ParameterGroups {
  /// Names containing "embedding" (tok_embeddings).
  int64_t embedding = 0;
  /// Names containing "moe.shared_experts".
  int64_t shared_experts = 0;
  /// Names containing "moe.router".
  int64_t router = 0;
  /// Names containing "moe.experts" (the routed experts).
  int64_t routed_experts = 0;
  /// Every other parameter.
  int64_t dense = 0;
};
ParameterGroups parameter_groups(const torch::nn::Module& model);

class Decoder;

/// Training FLOPs per token of block `layer`'s attention beyond its projections, at seq_len tokens per sequence:
/// 6 x H x (head_dim + v_head_dim) x seq_len for softmax attention (torchtitan's, no causal discount), the shape's
/// linear_attention_flops for a linear-attention block.
int64_t attention_flops_per_token(const DecoderShape& shape, int64_t layer, int64_t seq_len);

/// Training FLOPs per token of each part a pipeline split places, at seq_len tokens per sequence, as
/// num_flops_per_token counts them (their sum is num_flops_per_token): a block 6 x its parameters (of the
/// routed experts the top_k / num_experts active share) + its attention_flops_per_token; the
/// embedding lookup 0; norm + output 6 x their parameters (a tied embedding, as the head it also is).
/// `model` must hold every module (build it on meta).
parallel::PipelineModuleCosts pipeline_costs(const Decoder& model, int64_t seq_len);

}  // namespace titan::models
