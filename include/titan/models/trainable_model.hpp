// SPDX-License-Identifier: BSD-3-Clause
// TrainableModel: the model spec, exactly the calls Trainer<Model> makes on a model, every one of them
// required (nothing is detected and silently skipped, so a misspelled hook is a compile error naming
// it). Assert it right after a model's definition (`static_assert(TrainableModel<Llama3>)`) so a
// broken model fails there, with one readable message, not deep inside the trainer.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <concepts>
#include <memory>
#include <string>
#include <vector>

#include "titan/nn/attention_context.hpp"
#include "titan/parallel/plan.hpp"

namespace titan {

struct JobConfig;
namespace dist {
class Mesh;
}
namespace checkpoint {
class HfAdapter;
}

template <class M>
concept TrainableModel = std::derived_from<M, torch::nn::Module> &&
    requires(M& m, const M& cm, const at::Tensor& tokens, const JobConfig& config, const dist::Mesh& mesh,
             const at::Device& device, int64_t n, const std::vector<std::string>& modules,
             const nn::AttentionContext& context) {
  // Builds the model from the job config on `device` (meta: count and plan without memory);
  // n > 0 overrides the vocab size.
  { M::build(config, n, device) } -> std::same_as<std::shared_ptr<M>>;
  // The same, holding only the top-level module paths in `modules` (a pipeline rank's stages; empty:
  // all). Parameter names stay those of the whole model.
  { M::build(config, n, device, modules) } -> std::same_as<std::shared_ptr<M>>;
  // tokens (B, S) int64 and their attention context (positions, documents, the cp split; an empty
  // one: causal over 0..S-1) -> logits (B, S, V).
  { cm.forward(tokens, context) } -> std::same_as<at::Tensor>;
  // Runs only `modules` (one pipeline stage, in order) on x: tokens for the first stage, hidden
  // states after it; the last stage returns the logits.
  { cm.forward_part(tokens, modules, context) } -> std::same_as<at::Tensor>;
  // Initialises weights from the current RNG state.
  {m.init_weights()};
  // Every trainable tensor once (tied weights once).
  { cm.unique_parameters() } -> std::same_as<std::vector<at::Tensor>>;
  // Rows of the embedding: the tokenizer must fit in it.
  { cm.vocab_size() } -> std::convertible_to<int64_t>;
  // Parameter count, and training FLOPs per token at sequence length n (for MFU).
  { cm.num_params() } -> std::convertible_to<int64_t>;
  { cm.num_flops_per_token(n) } -> std::convertible_to<int64_t>;
  // How the job parallelizes it on mesh (titan::parallelize applies it). A model that only
  // trains on one device returns a plan with its data-parallel units (parallel::units_per_child).
  { cm.parallel_plan(config, mesh) } -> std::same_as<parallel::ParallelPlan>;
  // Hugging Face import/export (nullptr: the model has no HF twin).
  { cm.hf_adapter() } -> std::same_as<std::shared_ptr<const checkpoint::HfAdapter>>;
};

}  // namespace titan
