// SPDX-License-Identifier: BSD-3-Clause
// TrainableModel: what a model is to titan, and all of it: built from its own arguments, a forward (whole and by
// pipeline part), its init, its parameters and counts, and how it may be sharded. No job config and no mesh: the
// planner (parallel/planner.hpp) turns the model's ShardingSpec and the job's settings into a plan. Every call is
// required (nothing is detected and silently skipped, so a misspelled hook is a compile error naming it). Assert it
// right after a model's definition (`static_assert(TrainableModel<MyModel>)`) so a broken model fails there, with
// one readable message, not deep inside the trainer.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <concepts>
#include <memory>
#include <string>
#include <vector>

#include "titan/nn/attention_context.hpp"
#include "titan/parallel/sharding_spec.hpp"

namespace titan {

namespace checkpoint {
class HfAdapter;
}

/// Where a model is built, and which part of it.
struct ModelBuild {
  /// The device of its parameters (meta: shapes only, to count and plan without memory).
  at::Device device = at::kMeta;
  /// Top-level module paths to build (a pipeline rank's stages, from the plan); empty: the whole model. Parameter
  /// names stay those of the whole model.
  std::vector<std::string> modules{};
};

template <class M>
concept TrainableModel = std::derived_from<M, torch::nn::Module> &&
    requires(M& m, const M& cm, const typename M::Args& args, const ModelBuild& where, const at::Tensor& tokens,
             int64_t n, const std::vector<std::string>& modules, const nn::AttentionContext& context) {
  // Builds the model from its own arguments (M::Args) where `where` says, parameters uninitialised.
  { M::build(args, where) } -> std::same_as<std::shared_ptr<M>>;
  // tokens (B, S) int64 and their attention context (positions, documents, the cp split; an empty
  // one: causal over 0..S-1) -> logits (B, S, V).
  { cm.forward(tokens, context) } -> std::same_as<at::Tensor>;
  // Runs only `modules` (one pipeline stage, in order) on x: tokens for the first stage, hidden
  // states after it; the last stage returns the logits.
  { cm.forward_part(tokens, modules, context) } -> std::same_as<at::Tensor>;
  // Initialises weights from the init seed (nn::manual_init_seed): by parameter name, so every layout
  // initialises alike.
  {m.init_weights()};
  // Every trainable tensor once (tied weights once).
  { cm.unique_parameters() } -> std::same_as<std::vector<at::Tensor>>;
  // Rows of the embedding: the tokenizer must fit in it.
  { cm.vocab_size() } -> std::convertible_to<int64_t>;
  // Parameter count of the whole model, and its training FLOPs per token at sequence length n (for MFU):
  // the same before and after parallelize (count global shapes, not local shards).
  { cm.num_params() } -> std::convertible_to<int64_t>;
  { cm.num_flops_per_token(n) } -> std::convertible_to<int64_t>;
  // How it may be sharded (parallel/sharding_spec.hpp): the planner's input.
  { cm.sharding_spec() } -> std::same_as<parallel::ShardingSpec>;
  // Hugging Face import/export (nullptr: the model has no HF twin).
  { cm.hf_adapter() } -> std::same_as<std::shared_ptr<const checkpoint::HfAdapter>>;
};

}  // namespace titan
