// SPDX-License-Identifier: BSD-3-Clause
// TrainableModel: exactly the calls Trainer<Model> makes on a model. Assert it right after a
// model's definition (`static_assert(TrainableModel<Llama3>)`) so a broken model fails there, with
// one readable message, not deep inside the trainer.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <concepts>
#include <memory>
#include <vector>

namespace titan {

struct JobConfig;

template <class M>
concept TrainableModel =
    std::derived_from<M, torch::nn::Module> &&
    requires(M& m, const M& cm, const at::Tensor& tokens, const JobConfig& config, const at::Device& device,
             int64_t n) {
      // Builds the model from the job config on `device` (meta: count and plan without memory);
      // n > 0 overrides the vocab size.
      { M::build(config, n, device) } -> std::same_as<std::shared_ptr<M>>;
      // tokens (B, S) int64 -> logits (B, S, V).
      { cm.forward(tokens) } -> std::same_as<at::Tensor>;
      // Initialises weights from the current RNG state.
      { m.init_weights() };
      // Every trainable tensor once (tied weights once).
      { cm.unique_parameters() } -> std::same_as<std::vector<at::Tensor>>;
      // Rows of the embedding: the tokenizer must fit in it.
      { cm.vocab_size() } -> std::convertible_to<int64_t>;
      // Parameter count, and training FLOPs per token at sequence length n (for MFU).
      { cm.num_params() } -> std::convertible_to<int64_t>;
      { cm.num_flops_per_token(n) } -> std::convertible_to<int64_t>;
    };

}  // namespace titan
