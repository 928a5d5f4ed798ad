// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/decoder.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "titan/core/error.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/model_spec.hpp"
#include "titan/models/multi_token_prediction.hpp"
#include "titan/nn/kv_cache.hpp"
#include "titan/parallel/activation_checkpoint.hpp"

namespace titan::models {

// ---- block ---------------------------------------------------------------------------------------

DecoderBlock::DecoderBlock(int64_t layer_id_, Parts parts, const DecoderShape& shape, const at::TensorOptions& options)
    : layer_id(layer_id_), init_std(parts.init_std) {
  TITAN_CHECK_VALUE(parts.attention && ((parts.feed_forward == nullptr) != (parts.moe == nullptr)),
                    "[{}] expected block {} built with an attention and exactly one of feed_forward or moe, got "
                    "attention {}, feed_forward {}, moe {}. Fix the family's block factory.",
                    shape.where, layer_id_, parts.attention != nullptr, parts.feed_forward != nullptr,
                    parts.moe != nullptr);
  attention_norm = register_module(
      "attention_norm", std::make_shared<nn::RMSNorm>(shape.dim, shape.norm_eps, options, shape.norm_unit_offset));
  attention = register_module("attention", std::move(parts.attention));
  ffn_norm = register_module("ffn_norm",
                             std::make_shared<nn::RMSNorm>(shape.dim, shape.norm_eps, options, shape.norm_unit_offset));
  if (parts.moe) {
    moe = register_module("moe", std::move(parts.moe));
  } else {
    feed_forward = register_module("feed_forward", std::move(parts.feed_forward));
  }
}

at::Tensor DecoderBlock::forward(const at::Tensor& x, const nn::RopeTables& rope,
                                 const nn::AttentionContext& context) const {
  // Recomputed in backward when the plan checkpoints this block: the closure owns what it needs.
  return parallel::checkpoint_call(*this, x, [this, rope, context](const at::Tensor& in) {
    const at::Tensor h = in + attention->forward(attention_norm->forward(in), rope, context);  // (B, S, D)
    const at::Tensor normed = ffn_norm->forward(h);                                            // (B, S, D)
    return h + (moe ? moe->forward(normed) : feed_forward->forward(normed));                   // (B, S, D)
  });
}

at::Tensor DecoderBlock::forward_cached(const at::Tensor& x, const nn::RopeTables& rope, const at::Tensor& positions,
                                        const at::Tensor& mask, nn::KVCache& cache) const {
  const at::Tensor h =
      x + attention->forward_cached(attention_norm->forward(x), rope, positions, mask, cache, layer_id);  // (B, S, D)
  const at::Tensor normed = ffn_norm->forward(h);                                                         // (B, S, D)
  return h + (moe ? moe->forward(normed) : feed_forward->forward(normed));                                // (B, S, D)
}

void DecoderBlock::init_weights(const nn::InitSite& site) {
  attention_norm->reset_parameters();
  ffn_norm->reset_parameters();
  attention->init_weights(site / "attention", init_std);
  if (moe) {
    moe->init_weights(site / "moe", init_std);
  } else {
    feed_forward->init_weights(site / "feed_forward", init_std);
  }
}

// ---- decoder -------------------------------------------------------------------------------------

Decoder::Decoder(DecoderShape shape, int64_t seq_len, const at::TensorOptions& options,
                 const std::vector<std::string>& modules, const BlockFactory& make_block)
    : shape_(std::move(shape)), seq_len_(seq_len) {
  TITAN_CHECK_VALUE(seq_len > 0 && seq_len <= shape_.max_seq_len,
                    "[{}] expected training.seq_len in [1, {}] (the model's max_seq_len), got {}. "
                    "Lower training.seq_len.",
                    shape_.where, shape_.max_seq_len, seq_len);
  const ModelParts part(modules, shape_.n_layers, shape_.tied, shape_.where);
  if (part.holds("tok_embeddings")) {
    tok_embeddings =
        register_module("tok_embeddings", std::make_shared<nn::Embedding>(shape_.vocab_size, shape_.dim, options));
  }
  auto container = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < shape_.n_layers; ++i) {
    if (!part.holds("layers." + std::to_string(i))) continue;
    layers.push_back(container->register_module(std::to_string(i),
                                                std::make_shared<DecoderBlock>(i, make_block(i), shape_, options)));
  }
  if (part.holds("norm"))
    norm = register_module(
        "norm", std::make_shared<nn::RMSNorm>(shape_.dim, shape_.norm_eps, options, shape_.norm_unit_offset));
  if (!shape_.tied && part.holds("output")) {
    output = register_module("output", std::make_shared<nn::Linear>(shape_.dim, shape_.vocab_size, options));
  }
}

std::shared_ptr<Decoder> Decoder::build(const DecoderArgs& args, const ModelBuild& where) {
  return model_spec(args.family).build(args, where);
}

parallel::ShardingSpec Decoder::sharding_spec() const {
  parallel::ShardingSpec spec = decoder_sharding_spec(shape_);
  const bool whole = tok_embeddings && norm && static_cast<int64_t>(layers.size()) == shape_.n_layers;
  if (whole) spec.pipeline_costs = pipeline_costs(*this, seq_len_);
  return spec;
}

std::shared_ptr<const checkpoint::HfAdapter> Decoder::hf_adapter() const { return nullptr; }

at::Tensor Decoder::after_blocks(const at::Tensor& h, const at::Tensor& /*tokens*/,
                                 const nn::AttentionContext& /*context*/) const {
  return h;
}

void Decoder::init_extra_weights(const nn::InitSite& /*root*/) {}

at::Tensor Decoder::forward(const at::Tensor& tokens, const nn::AttentionContext& context) const {
  TITAN_CHECK_VALUE(tokens.dim() == 2 && tokens.size(1) <= seq_len_,
                    "[{}] expected tokens of shape (B, S<={}), got {}.", shape_.where, seq_len_,
                    c10::str(tokens.sizes()));
  TITAN_CHECK(tok_embeddings && norm && static_cast<int64_t>(layers.size()) == shape_.n_layers,
              "[{}] expected the whole model in forward(), got a part of {} blocks. Run a part with "
              "forward_part(x, modules).",
              shape_.where, layers.size());
  std::vector<std::string> all{"tok_embeddings"};
  for (const auto& layer : layers) all.push_back("layers." + std::to_string(layer->layer_id));
  all.insert(all.end(), {"norm", "output"});
  return forward_part(tokens, all, context);
}

const DecoderBlock& Decoder::block(const std::string& path) const {
  const int64_t index = ModelParts::layer_index(path);
  const auto it = std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l->layer_id == index; });
  TITAN_CHECK_VALUE(index >= 0 && it != layers.end(),
                    "[{}] expected forward_part modules held by this part, got '{}'. Build the part with the "
                    "stage's modules.",
                    shape_.where, path);
  return **it;
}

at::Tensor Decoder::forward_part(const at::Tensor& x, const std::vector<std::string>& modules,
                                 const nn::AttentionContext& context) const {
  TITAN_CHECK(rope_.freqs_cis.defined(),
              "[{}] expected a model on a real device, got one on meta. Build it with a device and call "
              "init_weights().",
              shape_.where);
  at::Tensor h = x;   // tokens (B, S), then (B, S, D), logits (B, S, V) after "output"
  at::Tensor tokens;  // (B, S) when this part embeds them
  for (const auto& path : modules) {
    if (path == "tok_embeddings" && tok_embeddings) {
      tokens = h;
      h = tok_embeddings->forward(h);
    } else if (path == "norm" && norm) {
      h = after_blocks(h, tokens, context);  // tokens undefined on a pipeline stage that does not embed
      h = norm->forward(h);
    } else if (path == "mtp") {
      // A family's multi-token prediction modules, a pipeline stage's part: after_blocks runs them at "norm".
    } else if (path == "output" && output) {
      h = output->forward(h);  // (B, S, V), or (B, S, V/tp) under loss parallel
    } else if (path == "output" && shape_.tied && tok_embeddings) {
      h = parallel::with_param(tok_embeddings->weight, [&](const at::Tensor& w) { return at::linear(h, w); });
    } else {
      h = block(path).forward(h, rope_, context);
    }
  }
  return h;
}

at::Tensor Decoder::forward_cached(const at::Tensor& tokens, nn::KVCache& cache) const {
  TITAN_CHECK_VALUE(tokens.dim() == 2 && cache.length() + tokens.size(1) <= seq_len_,
                    "[{}::forward_cached] expected tokens (B, S) with {} cached + S <= {} (the RoPE tables' length), "
                    "got {}. Build the model with a seq_len covering prompt and new tokens.",
                    shape_.where, cache.length(), seq_len_, c10::str(tokens.sizes()));
  TITAN_CHECK(tok_embeddings && norm && static_cast<int64_t>(layers.size()) == shape_.n_layers,
              "[{}::forward_cached] expected the whole model, got a part of {} blocks. Decoding runs without "
              "pipeline parallelism.",
              shape_.where, layers.size());
  TITAN_CHECK(rope_.freqs_cis.defined(),
              "[{}::forward_cached] expected a model on a real device, got one on meta. Build it with a device and "
              "load its weights.",
              shape_.where);
  at::NoGradGuard no_grad;
  const int64_t count = tokens.size(1);
  const at::Tensor positions = cache.positions(count, tokens.device());  // (B, S) or (S) int64
  const at::Tensor mask = cache.mask(count, tokens.device());            // (B or 1, 1, S, T) bool
  at::Tensor h = tok_embeddings->forward(tokens);                        // (B, S, D)
  for (const auto& layer : layers) h = layer->forward_cached(h, rope_, positions, mask, cache);
  cache.advance(count);
  h = norm->forward(h);                   // (B, S, D)
  if (output) return output->forward(h);  // (B, S, V)
  return parallel::with_param(tok_embeddings->weight,
                              [&](const at::Tensor& w) { return at::linear(h, w); });  // (B, S, V)
}

void Decoder::init_weights() { init_weights(nn::InitSite::current()); }

void Decoder::init_weights(const nn::InitSite& root) {
  // Every parameter draws from its own name's stream: a part fills exactly the whole model's values.
  const double out_std = 1.0 / std::sqrt(static_cast<double>(shape_.dim));
  if (tok_embeddings && shape_.tied) {
    // A tied matrix is also the output projection: N(0, 1) rows would give logits of std sqrt(D),
    // so it takes the output layer's init instead.
    nn::trunc_normal_(tok_embeddings->weight, root / "tok_embeddings.weight", 0.0, out_std, -3 * out_std, 3 * out_std);
  } else if (tok_embeddings) {
    nn::normal_(tok_embeddings->weight, root / "tok_embeddings.weight", 0.0, 1.0);
  }
  for (const auto& layer : layers) layer->init_weights(root / ("layers." + std::to_string(layer->layer_id)));
  if (norm) norm->reset_parameters();
  if (output) {
    nn::trunc_normal_(output->weight, root / "output.weight", 0.0, out_std, -3 * out_std, 3 * out_std);
  }
  init_extra_weights(root);
}

std::vector<at::Tensor> Decoder::unique_parameters() const { return models::unique_parameters(*this); }

int64_t Decoder::num_params() const {
  int64_t n = 0;
  for (const auto& p : unique_parameters()) n += parallel::global_numel(p);
  return n;
}

int64_t Decoder::num_flops_per_token(int64_t seq_len) const {
  // torchtitan's get_moe_model_nparams_and_flops, by parameter name (its dense formula when no MoE).
  const ParameterGroups g = parameter_groups(*this);
  const int64_t active_experts =
      shape_.moe_num_experts > 0 ? g.routed_experts * shape_.moe_top_k / shape_.moe_num_experts : 0;
  // The embedding lookup is not a matmul, unless the same matrix is also the output head.
  const int64_t head = shape_.tied ? g.embedding : 0;
  int64_t attention = 0;
  for (int64_t i = 0; i < shape_.n_layers; ++i) attention += attention_flops_per_token(shape_, i, seq_len);
  // Multi-token prediction: each depth's own parameters are in the groups above; its attention and its use of the
  // shared output head are not.
  for (const auto& mtp : mtp_modules(*this)) {
    for (const auto& depth : mtp->modules) {
      attention +=
          attention_flops_per_token(shape_, depth->block->layer_id, seq_len) + 6 * shape_.vocab_size * shape_.dim;
    }
  }
  return 6 * (g.dense + head + g.router + g.shared_experts + active_experts) + attention;
}

std::vector<std::shared_ptr<nn::MoE>> Decoder::moe_layers() const {
  std::vector<std::shared_ptr<nn::MoE>> out;
  for (const auto& layer : layers) {
    if (layer->moe) out.push_back(layer->moe);
  }
  return out;
}

}  // namespace titan::models
