// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3/model.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "titan/core/error.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/decoder.hpp"
#include "titan/nn/init.hpp"
#include "titan/parallel/activation_checkpoint.hpp"

namespace titan::qwen3 {

namespace {
constexpr int64_t kAttentionStreams = 4;  // wq, wk, wv, wo
constexpr int64_t kSwiGluStreams = 3;     // w1, w2, w3
}  // namespace

int64_t TransformerBlock::init_streams(const Qwen3Args& args, int64_t layer_id) {
  if (!args.is_moe_layer(layer_id)) return kAttentionStreams + kSwiGluStreams;
  // Routed experts, router gate, shared experts (when present).
  return kAttentionStreams + kSwiGluStreams + 1 + (args.moe.num_shared_experts > 0 ? kSwiGluStreams : 0);
}

TransformerBlock::TransformerBlock(int64_t layer_id_, const Qwen3Args& args, const at::TensorOptions& options)
    : layer_id(layer_id_),
      init_std(args.depth_init ? 0.02 / std::sqrt(2.0 * static_cast<double>(layer_id_ + 1))
                               : 0.02 / std::sqrt(2.0 * static_cast<double>(args.n_layers))) {
  attention_norm = register_module("attention_norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  attention = register_module(
      "attention",
      std::make_shared<nn::Attention>(
          args.dim, args.n_heads, args.n_kv_heads, options,
          nn::AttentionOptions{.head_dim = args.head_dim, .qk_norm = args.qk_norm, .qk_norm_eps = args.norm_eps}));
  ffn_norm = register_module("ffn_norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  if (args.is_moe_layer(layer_id)) {
    moe = register_module("moe", std::make_shared<nn::MoE>(args.moe, args.dim, args.moe_inter_dim, options));
  } else {
    feed_forward =
        register_module("feed_forward", std::make_shared<nn::FeedForward>(args.dim, args.hidden_dim, options));
  }
}

at::Tensor TransformerBlock::forward(const at::Tensor& x, const nn::RopeTables& rope) const {
  // Recomputed in backward when the plan checkpoints this block (the closure owns what it needs).
  return parallel::checkpoint_call(*this, x, [this, rope](const at::Tensor& in) {
    const at::Tensor h = in + attention->forward(attention_norm->forward(in), rope);  // (B, S, D)
    const at::Tensor normed = ffn_norm->forward(h);                                   // (B, S, D)
    return h + (moe ? moe->forward(normed) : feed_forward->forward(normed));          // (B, S, D)
  });
}

void TransformerBlock::init_weights() {
  attention_norm->reset_parameters();
  ffn_norm->reset_parameters();
  attention->init_weights(init_std);
  if (moe) {
    moe->init_weights(init_std);
  } else {
    feed_forward->init_weights(init_std);
  }
}

Qwen3::Qwen3(const Qwen3Args& args, int64_t seq_len, const at::TensorOptions& options,
             const std::vector<std::string>& modules)
    : args_(args), seq_len_(seq_len) {
  args.validate();
  TITAN_CHECK_VALUE(seq_len > 0 && seq_len <= args.max_seq_len,
                    "[titan::qwen3] expected training.seq_len in [1, {}] (the model's max_seq_len), got {}. "
                    "Lower training.seq_len.",
                    args.max_seq_len, seq_len);
  const models::ModelParts part(modules, args.n_layers, args.tie_word_embeddings, "titan::qwen3");
  if (part.holds("tok_embeddings")) {
    tok_embeddings =
        register_module("tok_embeddings", std::make_shared<nn::Embedding>(args.vocab_size, args.dim, options));
  }
  auto container = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args.n_layers; ++i) {
    if (!part.holds("layers." + std::to_string(i))) continue;
    layers.push_back(
        container->register_module(std::to_string(i), std::make_shared<TransformerBlock>(i, args, options)));
  }
  if (part.holds("norm"))
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  if (!args.tie_word_embeddings && part.holds("output")) {
    output = register_module("output", std::make_shared<nn::Linear>(args.dim, args.vocab_size, options));
  }
  if (options.device().type() != at::kMeta) {
    // RoPE tables are derived, not parameters: rebuilt on the model's device, never checkpointed.
    rope_ = nn::make_rope_tables(
        {.head_dim = args.head_dim, .max_positions = seq_len, .theta = args.rope_theta, .llama3_scaling = false},
        options.device());
  }
}

at::Tensor Qwen3::forward(const at::Tensor& tokens) const {
  TITAN_CHECK_VALUE(tokens.dim() == 2 && tokens.size(1) <= seq_len_,
                    "[titan::qwen3] expected tokens of shape (B, S<={}), got {}.", seq_len_, c10::str(tokens.sizes()));
  TITAN_CHECK(tok_embeddings && norm && static_cast<int64_t>(layers.size()) == args_.n_layers,
              "[titan::qwen3] expected the whole model in forward(), got a part of {} blocks. Run a part with "
              "forward_part(x, modules).",
              layers.size());
  std::vector<std::string> all{"tok_embeddings"};
  for (const auto& layer : layers) all.push_back("layers." + std::to_string(layer->layer_id));
  all.emplace_back("norm");
  all.emplace_back("output");
  return forward_part(tokens, all);
}

at::Tensor Qwen3::forward_part(const at::Tensor& x, const std::vector<std::string>& modules) const {
  TITAN_CHECK(rope_.freqs_cis.defined(),
              "[titan::qwen3] expected a model on a real device, got one on meta. Build it with a device "
              "(Qwen3::build(config, 0, device)) and call init_weights().");
  at::Tensor h = x;  // tokens (B, S), then (B, S, D), logits (B, S, V) after "output"
  for (const auto& path : modules) {
    if (path == "tok_embeddings" && tok_embeddings) {
      h = tok_embeddings->forward(h);
    } else if (path == "norm" && norm) {
      h = norm->forward(h);
    } else if (path == "output" && output) {
      h = output->forward(h);  // (B, S, V), or (B, S, V/tp) under loss parallel
    } else if (path == "output" && args_.tie_word_embeddings && tok_embeddings) {
      h = parallel::with_param(tok_embeddings->weight, [&](const at::Tensor& w) { return at::linear(h, w); });
    } else {
      const int64_t index = models::ModelParts::layer_index(path);
      auto it = std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l->layer_id == index; });
      TITAN_CHECK_VALUE(index >= 0 && it != layers.end(),
                        "[titan::qwen3] expected forward_part modules held by this part, got '{}'. Build the part "
                        "with the stage's modules.",
                        path);
      h = (*it)->forward(h, rope_);
    }
  }
  return h;
}

void Qwen3::init_weights() {
  // Init streams are taken in the whole model's order; a part skips the streams of modules it does
  // not hold, so its weights are exactly the whole model's.
  const double out_std = 1.0 / std::sqrt(static_cast<double>(args_.dim));
  if (!tok_embeddings) {
    nn::skip_init_streams(1);
  } else if (!args_.tie_word_embeddings) {
    nn::normal_(tok_embeddings->weight, 0.0, 1.0);
  } else {
    // torchtitan draws N(0, 1) and then re-draws the tied matrix as the output layer: one draw here.
    nn::trunc_normal_(tok_embeddings->weight, 0.0, out_std, -3 * out_std, 3 * out_std);
  }
  auto next = layers.begin();
  for (int64_t i = 0; i < args_.n_layers; ++i) {
    if (next != layers.end() && (*next)->layer_id == i) {
      (*next++)->init_weights();
    } else {
      nn::skip_init_streams(TransformerBlock::init_streams(args_, i));
    }
  }
  if (norm) norm->reset_parameters();
  if (output) nn::trunc_normal_(output->weight, 0.0, out_std, -3 * out_std, 3 * out_std);
}

std::vector<at::Tensor> Qwen3::unique_parameters() const { return models::unique_parameters(*this); }

int64_t Qwen3::num_params() const {
  int64_t n = 0;
  for (const auto& p : unique_parameters()) n += p.numel();
  return n;
}

int64_t Qwen3::num_flops_per_token(int64_t seq_len) const {
  // torchtitan's get_moe_model_nparams_and_flops, by parameter name.
  const models::ParameterGroups g = models::parameter_groups(*this);
  const int64_t active_experts = args_.moe_enabled ? g.routed_experts * args_.moe.top_k / args_.moe.num_experts : 0;
  // The embedding lookup is not a matmul, unless the same matrix is also the output head.
  const int64_t head = args_.tie_word_embeddings ? g.embedding : 0;
  return 6 * (g.dense + head + g.router + g.shared_experts + active_experts) +
         6 * args_.n_layers * args_.n_heads * (2 * args_.head_dim) * seq_len;
}

std::vector<std::shared_ptr<nn::MoE>> Qwen3::moe_layers() const {
  std::vector<std::shared_ptr<nn::MoE>> out;
  for (const auto& layer : layers) {
    if (layer->moe) out.push_back(layer->moe);
  }
  return out;
}

}  // namespace titan::qwen3
