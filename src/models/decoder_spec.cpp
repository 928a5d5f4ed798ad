// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/decoder_spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_set>

#include "titan/core/error.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/decoder.hpp"
#include "titan/models/multi_token_prediction.hpp"

namespace titan::models {

void unknown_flavor(const std::vector<std::string>& known, std::string_view name, const char* where) {
  throw ConfigError("model.flavor", fmt::format("[{}] expected model.flavor to be one of {}, got '{}'. Pick one of "
                                                "these flavors.",
                                                where, known, name));
}

ModelParts::ModelParts(const std::vector<std::string>& modules, int64_t n_layers, bool tied, const char* where)
    : modules_(modules) {
  for (const auto& path : modules) {
    const bool known = path == "tok_embeddings" || path == "norm" || path == "output" ||
                       (layer_index(path) >= 0 && layer_index(path) < n_layers);
    TITAN_CHECK_VALUE(known && !(path == "output" && tied),
                      "[{}] expected model parts named tok_embeddings, layers.0 .. layers.{}, norm{}, got '{}'. Fix "
                      "the pipeline split (module_fqns_per_model_part).",
                      where, n_layers - 1, tied ? "" : ", output", path);
  }
  TITAN_CHECK_NOT_IMPLEMENTED(modules.empty() || !tied,
                              "[{}] expected untied embeddings in a model part, got tie_word_embeddings = true: the "
                              "first and last stage would share a weight. Pipeline parallelism needs a flavor with "
                              "its own output layer.",
                              where);
}

bool ModelParts::holds(const std::string& path) const {
  return modules_.empty() || std::find(modules_.begin(), modules_.end(), path) != modules_.end();
}

int64_t ModelParts::layer_index(const std::string& path) {
  if (!path.starts_with("layers.")) return -1;
  const std::string digits = path.substr(std::string("layers.").size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& model) {
  std::vector<at::Tensor> unique;
  std::unordered_set<const void*> seen;
  for (const auto& p : model.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) unique.push_back(p);
  }
  return unique;
}

ParameterGroups parameter_groups(const torch::nn::Module& model) {
  ParameterGroups g;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const int64_t n = parallel::global_numel(item.value());
    if (name.find("embedding") != std::string::npos) {
      g.embedding += n;
    } else if (name.find("moe.shared_experts") != std::string::npos) {
      g.shared_experts += n;
    } else if (name.find("moe.router") != std::string::npos) {
      g.router += n;
    } else if (name.find("moe.experts") != std::string::npos) {
      g.routed_experts += n;
    } else {
      g.dense += n;
    }
  }
  return g;
}

namespace {

bool is_moe_layer(const DecoderShape& shape, int64_t i) {
  return std::find(shape.moe_layers.begin(), shape.moe_layers.end(), i) != shape.moe_layers.end();
}

void add_block_roles(parallel::ShardingSpec& spec, const DecoderShape& shape, int64_t i) {
  using Role = parallel::TensorParallelRole;
  const std::string block = "layers." + std::to_string(i);
  auto& tp = spec.tensor_parallel;
  tp.emplace_back(block + ".attention_norm", Role::sequence_norm);
  tp.emplace_back(block + ".attention", Role::module_input);
  for (const std::string& w : shape.head_projections) tp.emplace_back(block + ".attention." + w, Role::colwise);
  // These see every rank's input (or one head's features): each rank's gradient is its heads' share.
  for (const std::string& m : shape.replicated_attention) tp.emplace_back(block + ".attention." + m, Role::replicated);
  tp.emplace_back(block + ".attention.wo", Role::rowwise);
  tp.emplace_back(block + ".ffn_norm", Role::sequence_norm);
  if (is_moe_layer(shape, i)) {
    parallel::MoeModule moe{.path = block + ".moe", .replicated = {"router"}};
    if (shape.shared_experts) moe.replicated.push_back("shared_experts");
    if (shape.shared_expert_gate) moe.replicated.push_back("shared_gate");
    spec.moe.push_back(std::move(moe));
    tp.emplace_back(block + ".moe", Role::moe);
    return;
  }
  tp.emplace_back(block + ".feed_forward", Role::module_input);
  for (const char* w : {".feed_forward.w1", ".feed_forward.w3"}) tp.emplace_back(block + w, Role::colwise);
  tp.emplace_back(block + ".feed_forward.w2", Role::rowwise);
}

}  // namespace

parallel::ShardingSpec decoder_sharding_spec(const DecoderShape& shape) {
  parallel::ShardingSpec spec{
      .model = shape.where, .tensor_parallel_divides = {{"n_heads", shape.n_heads}, {"n_kv_heads", shape.n_kv_heads}}};
  spec.fsdp_units.push_back({"tok_embeddings"});
  spec.tensor_parallel.emplace_back("tok_embeddings", parallel::TensorParallelRole::vocab_embedding);
  spec.pipeline.input_modules = {"tok_embeddings"};
  for (int64_t i = 0; i < shape.n_layers; ++i) {
    const std::string block = "layers." + std::to_string(i);
    if (is_moe_layer(shape, i)) {
      // The routed experts hold most of an MoE block's weights: a unit of their own, gathered after the
      // attention has run.
      std::vector<std::string> dense{block + ".attention_norm", block + ".attention", block + ".ffn_norm",
                                     block + ".moe.router"};
      if (shape.shared_experts) dense.push_back(block + ".moe.shared_experts");
      if (shape.shared_expert_gate) dense.push_back(block + ".moe.shared_gate");
      spec.fsdp_units.push_back(std::move(dense));
      spec.fsdp_units.push_back({block + ".moe.experts"});
    } else {
      spec.fsdp_units.push_back({block});
    }
    add_block_roles(spec, shape, i);
    spec.attention.push_back(block + ".attention");
    spec.blocks.push_back(block);
    spec.pipeline.layer_modules.push_back(block);
  }
  // Norm and output run back to back and start backward: one unit, one collective.
  spec.fsdp_units.push_back(shape.tied ? std::vector<std::string>{"norm"} : std::vector<std::string>{"norm", "output"});
  spec.tensor_parallel.emplace_back("norm", parallel::TensorParallelRole::sequence_norm);
  if (!shape.tied) spec.tensor_parallel.emplace_back("output", parallel::TensorParallelRole::head);
  spec.pipeline.output_modules =
      shape.tied ? std::vector<std::string>{"norm"} : std::vector<std::string>{"norm", "output"};
  if (shape.tied) spec.tied.emplace_back("output.weight", "tok_embeddings.weight");
  if (!shape.tensor_parallel) {
    spec.refused.push_back({"tp",
                            "tensor parallelism of this model is not built. Use data, pipeline, context and "
                            "expert parallelism."});
  }
  if (!shape.pipeline_and_context_parallel) {
    for (const char* axis : {"pp", "cp"}) {
      spec.refused.push_back({axis,
                              "context and pipeline parallelism of this model are not built (or not tested) "
                              "yet. Use data, tensor and expert parallelism."});
    }
  }
  // A tied output is the first stage's embedding: the last stage would need the same weight.
  if (shape.tied) {
    spec.refused.push_back({"pp",
                            "the embedding and the output projection are tied (tie_word_embeddings = true): "
                            "the first and last stage would share a weight. Pipeline parallelism needs a flavor "
                            "with its own output layer."});
  }
  return spec;
}

int64_t attention_flops_per_token(const DecoderShape& shape, int64_t layer, int64_t seq_len) {
  const auto& linear = shape.linear_attention_layers;
  if (std::find(linear.begin(), linear.end(), layer) != linear.end()) return shape.linear_attention_flops;
  return 6 * shape.n_heads * (shape.head_dim + shape.v_head_dim) * seq_len;
}

parallel::PipelineModuleCosts pipeline_costs(const Decoder& model, int64_t seq_len) {
  const DecoderShape& shape = model.shape();
  TITAN_CHECK_VALUE(model.tok_embeddings && model.norm && static_cast<int64_t>(model.layers.size()) == shape.n_layers,
                    "[{}] expected the whole model to weigh its pipeline stages, got a part of {} blocks. Build "
                    "the whole model on the meta device for pipeline_costs.",
                    shape.where, model.layers.size());
  const auto flops = [&](const ParameterGroups& g) {
    const int64_t experts = shape.moe_num_experts > 0 ? g.routed_experts * shape.moe_top_k / shape.moe_num_experts : 0;
    return 6.0 * static_cast<double>(g.dense + g.router + g.shared_experts + experts);
  };
  parallel::PipelineModuleCosts costs;
  for (const auto& block : model.layers) {
    costs.layers.push_back(flops(parameter_groups(*block)) +
                           static_cast<double>(attention_flops_per_token(shape, block->layer_id, seq_len)));
  }
  costs.output = flops(parameter_groups(*model.norm));
  costs.output += shape.tied ? 6.0 * static_cast<double>(model.tok_embeddings->weight.numel())
                             : flops(parameter_groups(*model.output));
  // Multi-token prediction's depths run on the stage with the head: their own parameters, attention and pass through
  // the shared head, as num_flops_per_token counts them.
  for (const auto& mtp : mtp_modules(model)) {
    for (const auto& depth : mtp->modules) {
      costs.output += flops(parameter_groups(*depth)) +
                      static_cast<double>(attention_flops_per_token(shape, depth->block->layer_id, seq_len) +
                                          6 * shape.vocab_size * shape.dim);
    }
  }
  return costs;
}

}  // namespace titan::models
