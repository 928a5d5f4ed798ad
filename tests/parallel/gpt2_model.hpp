// SPDX-License-Identifier: BSD-3-Clause
// A GPT-2-shaped model of the tests' own, none of the bundled families: token embeddings tied to the head, learned
// absolute position embeddings, LayerNorms with biases, attention without RoPE, biased q/k/v/o and MLP projections,
// zero biases and unit norms at init. Like a user's model it is only a model: built from its own arguments, it
// declares how it may be sharded and never sees the job config or the mesh.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/models/trainable_model.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/counts.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"

namespace titan::test {

/// The model's own arguments.
struct Gpt2Args {
  /// Rows of the token embedding (and of the tied head).
  int64_t vocab_size = 128;
  /// Width of the residual stream.
  int64_t dim = 32;
  /// Attention heads (head_dim = dim / heads).
  int64_t heads = 4;
  /// Transformer blocks.
  int64_t blocks = 2;
  /// Rows of the position embedding: the longest sequence.
  int64_t max_seq_len = 32;
};

/// c_fc then c_proj, GELU between (tanh approximation, as GPT-2).
struct Gpt2Mlp : torch::nn::Module {
  Gpt2Mlp(int64_t dim, const at::TensorOptions& o)
      : up(register_module("up", std::make_shared<nn::Linear>(dim, 4 * dim, o, /*bias=*/true))),
        down(register_module("down", std::make_shared<nn::Linear>(4 * dim, dim, o, /*bias=*/true))) {}
  at::Tensor forward(const at::Tensor& x) const {  // (B, S, D) -> (B, S, D)
    return parallel::module_call(
        *this, x, [&](const at::Tensor& in) { return down->forward(at::gelu(up->forward(in), "tanh")); });
  }
  std::shared_ptr<nn::Linear> up;    // weight (4D, D), bias (4D)
  std::shared_ptr<nn::Linear> down;  // weight (D, 4D), bias (D)
};

/// x + attn(ln_1(x)), then h + mlp(ln_2(h)).
struct Gpt2Block : torch::nn::Module {
  Gpt2Block(const Gpt2Args& a, const at::TensorOptions& o)
      : ln_1(register_module("ln_1", std::make_shared<nn::LayerNorm>(a.dim, 1e-5, o))),
        attn(register_module("attn",
                             std::make_shared<nn::Attention>(
                                 a.dim, a.heads, a.heads, o,
                                 nn::AttentionOptions{.position_encoding = nn::PositionEncoding::none, .bias = true}))),
        ln_2(register_module("ln_2", std::make_shared<nn::LayerNorm>(a.dim, 1e-5, o))),
        mlp(register_module("mlp", std::make_shared<Gpt2Mlp>(a.dim, o))) {}
  at::Tensor forward(const at::Tensor& x, const nn::AttentionContext& context) const {  // (B, S, D) -> (B, S, D)
    const at::Tensor h = x + attn->forward(ln_1->forward(x), nn::RopeTables{}, context);
    return h + mlp->forward(ln_2->forward(h));
  }
  std::shared_ptr<nn::LayerNorm> ln_1;  // weight, bias (D)
  std::shared_ptr<nn::Attention> attn;  // wq, wk, wv, wo: weight (D, D), bias (D)
  std::shared_ptr<nn::LayerNorm> ln_2;  // weight, bias (D)
  std::shared_ptr<Gpt2Mlp> mlp;
};

class Gpt2 : public torch::nn::Module {
 public:
  using Args = Gpt2Args;
  Gpt2(const Args& a, const at::TensorOptions& o) : args_(a) {
    wte = register_module("wte", std::make_shared<nn::Embedding>(a.vocab_size, a.dim, o));
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(a.max_seq_len, a.dim, o));
    auto container = register_module("h", std::make_shared<torch::nn::Module>());
    for (int64_t i = 0; i < a.blocks; ++i) {
      blocks.push_back(container->register_module(std::to_string(i), std::make_shared<Gpt2Block>(a, o)));
    }
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(a.dim, 1e-5, o));
    head = register_module("head", std::make_shared<nn::TiedLinear>(wte));
  }

  static std::shared_ptr<Gpt2> build(const Args& args, const ModelBuild& where) {
    TITAN_CHECK_NOT_IMPLEMENTED(where.modules.empty(), "[gpt2] expected no pipeline split, got {} modules.",
                                where.modules.size());
    return std::make_shared<Gpt2>(args, at::TensorOptions().device(where.device));
  }
  /// tokens (B, S) -> logits (B, S, V), or (B, S, V/tp) under loss parallel.
  at::Tensor forward(const at::Tensor& tokens, const nn::AttentionContext& context = {}) const {
    const at::Tensor positions = context.positions.defined()
                                     ? context.positions
                                     : at::arange(tokens.size(1), tokens.options()).unsqueeze(0);  // (B or 1, S)
    // Under sequence parallelism both are this rank's sequence shard: (B, S/tp, D) and (1, S/tp, D).
    at::Tensor x = wte->forward(tokens) + wpe->forward(positions);  // (B, S, D)
    for (const auto& b : blocks) x = b->forward(x, context);
    return head->forward(ln_f->forward(x));
  }
  at::Tensor forward_part(const at::Tensor& x, const std::vector<std::string>&,
                          const nn::AttentionContext& context = {}) const {
    return forward(x, context);  // build() refuses pipeline parts
  }
  /// GPT-2's: embeddings and projections N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 L)), biases zero,
  /// norms one; each parameter by its name, so every layout starts alike.
  void init_weights() {
    const nn::InitSite root = nn::InitSite::current();
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(args_.blocks));
    nn::normal_(wte->weight, root / "wte.weight", 0.0, 0.02);
    nn::normal_(wpe->weight, root / "wpe.weight", 0.0, 0.01);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const nn::InitSite b = root / fmt::format("h.{}", i);
      const Gpt2Block& block = *blocks[i];
      const std::pair<const char*, nn::Linear*> linears[] = {
          {"attn.wq", block.attn->wq.get()}, {"attn.wk", block.attn->wk.get()}, {"attn.wv", block.attn->wv.get()},
          {"attn.wo", block.attn->wo.get()}, {"mlp.up", block.mlp->up.get()},   {"mlp.down", block.mlp->down.get()}};
      for (const auto& [name, linear] : linears) {
        const bool residual = linear == block.attn->wo.get() || linear == block.mlp->down.get();
        nn::normal_(linear->weight, b / fmt::format("{}.weight", name), 0.0, residual ? residual_std : 0.02);
        nn::zeros_(linear->bias);
      }
      block.ln_1->reset_parameters();
      block.ln_2->reset_parameters();
    }
    ln_f->reset_parameters();
  }
  std::vector<at::Tensor> unique_parameters() const { return parameters(); }  // the head owns none
  int64_t vocab_size() const { return args_.vocab_size; }
  int64_t num_params() const { return nn::parameter_count(*this); }
  int64_t num_flops_per_token(int64_t seq_len) const {
    // The position table is looked up, not multiplied; the token table is also the head.
    return nn::training_flops_per_token({.matmul_params = num_params() - nn::parameter_count(*wpe),
                                         .layers = args_.blocks,
                                         .heads = args_.heads,
                                         .head_dim = args_.dim / args_.heads,
                                         .seq_len = seq_len});
  }
  /// FSDP units: the embeddings, each block, the final norm with the head; Megatron's TP with sequence parallelism.
  parallel::ShardingSpec sharding_spec() const {
    using Role = parallel::TensorParallelRole;
    parallel::ShardingSpec spec{.model = "gpt2", .tensor_parallel_divides = {{"heads", args_.heads}}};
    spec.fsdp_units.push_back({"wte", "wpe"});
    spec.tensor_parallel = {{"wte", Role::vocab_embedding}, {"wpe", Role::position_embedding}};
    for (int64_t i = 0; i < args_.blocks; ++i) {
      const std::string b = fmt::format("h.{}", i);
      spec.fsdp_units.push_back({b});
      spec.blocks.push_back(b);
      spec.attention.push_back(b + ".attn");
      auto& tp = spec.tensor_parallel;
      tp.emplace_back(b + ".ln_1", Role::sequence_norm);
      tp.emplace_back(b + ".attn", Role::module_input);
      for (const char* w : {".attn.wq", ".attn.wk", ".attn.wv"}) tp.emplace_back(b + w, Role::colwise);
      tp.emplace_back(b + ".attn.wo", Role::rowwise);
      tp.emplace_back(b + ".ln_2", Role::sequence_norm);
      tp.emplace_back(b + ".mlp", Role::module_input);
      tp.emplace_back(b + ".mlp.up", Role::colwise);
      tp.emplace_back(b + ".mlp.down", Role::rowwise);
    }
    spec.fsdp_units.push_back({"ln_f", "head"});
    spec.tensor_parallel.emplace_back("ln_f", Role::sequence_norm);
    spec.tensor_parallel.emplace_back("head", Role::head);
    spec.tied.emplace_back("head.weight", "wte.weight");
    spec.refused.push_back({"pp", "the test model builds no pipeline parts."});
    spec.refused.push_back({"cp", "the test model is not tested under context parallelism."});
    return spec;
  }
  std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const { return nullptr; }

  std::shared_ptr<nn::Embedding> wte;              // weight (V, D); also the head's
  std::shared_ptr<nn::Embedding> wpe;              // weight (P, D)
  std::vector<std::shared_ptr<Gpt2Block>> blocks;  // registered as h.<i>
  std::shared_ptr<nn::LayerNorm> ln_f;             // weight, bias (D)
  std::shared_ptr<nn::TiedLinear> head;            // reads wte.weight

 private:
  Args args_;
};

static_assert(TrainableModel<Gpt2>);

}  // namespace titan::test
