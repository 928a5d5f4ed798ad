// SPDX-License-Identifier: BSD-3-Clause
// What every bundled decoder-only model (Llama 3, Qwen3, ...) shares around its blocks: the model
// parts a pipeline rank builds (top-level paths tok_embeddings, layers.N, norm, output), parameters
// without duplicates, and the plan pieces that depend only on the number of blocks (pipeline split,
// context parallelism, activation checkpointing) or on the job config alone (data-parallel options).
// A model's own parallelize.cpp adds what depends on its layers (TP styles, FSDP units).
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

namespace titan {
struct JobConfig;
struct ParallelismConfig;
struct ActivationCheckpointConfig;
}  // namespace titan
namespace titan::dist {
class Mesh;
}

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

/// FSDP units in forward order: tok_embeddings; each block (an MoE block as two: its attention, norms,
/// router and shared experts, then its routed experts `layers.N.moe.experts`); norm (+ output).
std::vector<std::vector<std::string>> data_parallel_units(const DecoderShape& shape);

/// torchtitan's TP plan (docs/tensor_parallel.md): embedding vocab-parallel; per block attention_norm
/// and ffn_norm SequenceParallel, the head projections (wq/wk/wv) colwise, wo rowwise, the replicated
/// attention modules SequenceParallel (weights whole on each rank, gradients summed), a dense feed_forward's w1/w3
/// colwise and w2 rowwise; norm SequenceParallel; output colwise (vocab-sharded logits under loss parallel). An MoE
/// block's moe runs on its rank's tokens with replicated experts (SequenceParallel: gradients summed over tp) under
/// sequence parallelism, replicated without it; expert parallelism is a separate axis. With sharded_experts
/// (expert tensor parallelism, etp = tp) only the MoE's router and shared experts are SequenceParallel: the routed
/// experts are split over tp by expert parallelism, each rank's slice with a gradient of its own. Checks that
/// `degree` divides the heads and refuses tied embeddings.
parallel::TensorParallelPlan tensor_parallel_plan(const DecoderShape& shape, int64_t degree, bool sequence_parallel,
                                                  bool loss_parallel, bool sharded_experts = false);

/// Expert parallelism on a mesh with ep > 1 or etp > 1 (torchtitan's ExpertParallel / ExpertTensorParallel):
/// every MoE block's `layers.N.moe`, its routed experts computing in `compute_dtype` (FSDP's param_dtype); an
/// empty plan when ep = etp = 1.
parallel::ExpertParallelPlan expert_parallel_plan(const DecoderShape& shape, int64_t ep, at::ScalarType compute_dtype,
                                                  int64_t etp = 1);

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

/// Training FLOPs per token of each part a pipeline split places, at seq_len tokens per sequence, as
/// num_flops_per_token counts them (their sum is num_flops_per_token): a block 6 x its parameters (of the
/// routed experts the top_k / num_experts active share) + 6 x H x (head_dim + v_head_dim) x seq_len; the
/// embedding lookup 0; norm + output 6 x their parameters (a tied embedding, as the head it also is).
/// `model` must hold every module (build it on meta).
parallel::PipelineModuleCosts pipeline_costs(const Decoder& model, int64_t seq_len);

/// The pipeline split of n_layers blocks over pp ranks from the parallelism.pipeline_parallel_* keys:
/// stages per rank from the schedule or layers_per_stage; then, with pipeline_parallel_split = layers,
/// torchtitan's cut (the embeddings count as first_stage_less_layers layers, norm + output as
/// last_stage_less_layers), with flops the cut into stages of near-equal `costs` (pipeline_costs;
/// required then); or module_fqns_per_model_part verbatim.
parallel::PipelinePlan pipeline_plan(int64_t n_layers, int64_t pp, const ParallelismConfig& parallelism,
                                     const parallel::PipelineModuleCosts& costs = {});

/// Context parallelism from the parallelism.context_parallel_* keys: every block's attention
/// (layers.N.attention) attends across the cp split.
parallel::ContextParallelPlan context_parallel_plan(int64_t n_layers, const ParallelismConfig& parallelism);

/// Activation checkpointing of layers.N from the activation_checkpoint.* keys (torchtitan's): none;
/// full; selective N (blocks N, 2N, ... counting from 1) or op. Under op, per_op_sac_force_recompute_mm_
/// shapes_by_fqns become force_recompute_mm, except torchtitan's default "moe.router.gate" when the
/// model has no MoE router (`has_moe` false). Errors (prefixed `where`) name the key.
parallel::ActivationCheckpointPlan activation_checkpoint_plan(int64_t n_layers, const ActivationCheckpointConfig& ac,
                                                              bool has_moe, const char* where);

/// The data-parallel options the job config asks for: fsdp_reshard_after_forward (never under PP by
/// default, as torchtitan), FSDP mixed precision (training.mixed_precision_*: bf16 by default on GPU,
/// fp32 on CPU), and float8 all-gather of the float8 Linears of `model`.
parallel::DataParallelOptions data_parallel_options(const torch::nn::Module& model, const JobConfig& config,
                                                    const dist::Mesh& mesh);

class Decoder;
/// The whole plan the job config asks for on mesh, from the pieces above and the model's shape: TP
/// (sequence parallel; parallelism.disable_loss_parallel, enable_async_tensor_parallel) when tp > 1,
/// the pipeline split when pp > 1, CP when cp > 1, activation checkpointing, FSDP/HSDP/DDP units and
/// options, and EP when ep > 1. Refuses pp or cp > 1 for a shape without pipeline_and_context_parallel.
parallel::ParallelPlan decoder_parallel_plan(const Decoder& model, const JobConfig& config, const dist::Mesh& mesh);

}  // namespace titan::models
