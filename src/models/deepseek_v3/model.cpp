// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/deepseek_v3/model.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/models/decoder.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/sequence_attention.hpp"
#include "titan/parallel/activation_checkpoint.hpp"

namespace titan::deepseek_v3 {
namespace {
constexpr double kInStd = 0.02;
// torch.nn.init.trunc_normal_'s default absolute cut-offs, kept for parity with torchtitan.
constexpr double kCutLow = -2.0;
constexpr double kCutHigh = 2.0;
}  // namespace

// ---- attention -----------------------------------------------------------------------------------

MultiLatentAttention::MultiLatentAttention(const DeepSeekV3Args& args, double softmax_mscale_,
                                           const at::TensorOptions& options)
    : qk_nope_head_dim(args.qk_nope_head_dim),
      qk_rope_head_dim(args.qk_rope_head_dim),
      v_head_dim(args.v_head_dim),
      kv_lora_rank(args.kv_lora_rank),
      softmax_mscale(softmax_mscale_) {
  // The values are zero-padded to the query/key head dim so that every attention kernel (the flash
  // kernels want one head dim) serves MLA; a wider value head would need the queries padded instead.
  TITAN_CHECK_VALUE(args.v_head_dim <= args.qk_head_dim() && args.qk_rope_head_dim % 2 == 0,
                    "[titan::deepseek_v3::MultiLatentAttention] expected v_head_dim <= qk_nope_head_dim + "
                    "qk_rope_head_dim and an even qk_rope_head_dim, got v_head_dim {}, qk_nope_head_dim {}, "
                    "qk_rope_head_dim {}. Fix the model args.",
                    args.v_head_dim, args.qk_nope_head_dim, args.qk_rope_head_dim);
  const int64_t h = args.n_heads;
  const double latent_eps = args.latent_norm_eps.value_or(args.norm_eps);
  if (args.q_lora_rank == 0) {
    wq = register_module("wq", std::make_shared<nn::Linear>(args.dim, h * args.qk_head_dim(), options));
  } else {
    wq_a = register_module("wq_a", std::make_shared<nn::Linear>(args.dim, args.q_lora_rank, options));
    q_norm = register_module("q_norm", std::make_shared<nn::RMSNorm>(args.q_lora_rank, latent_eps, options));
    wq_b = register_module("wq_b", std::make_shared<nn::Linear>(args.q_lora_rank, h * args.qk_head_dim(), options));
  }
  wkv_a = register_module("wkv_a",
                          std::make_shared<nn::Linear>(args.dim, args.kv_lora_rank + args.qk_rope_head_dim, options));
  kv_norm = register_module("kv_norm", std::make_shared<nn::RMSNorm>(args.kv_lora_rank, latent_eps, options));
  wkv_b = register_module(
      "wkv_b", std::make_shared<nn::Linear>(args.kv_lora_rank, h * (args.qk_nope_head_dim + args.v_head_dim), options));
  wo = register_module("wo", std::make_shared<nn::Linear>(h * args.v_head_dim, args.dim, options));
}

at::Tensor MultiLatentAttention::forward(const at::Tensor& x, const nn::RopeTables& rope) const {
  check_attention_context("titan::deepseek_v3::MultiLatentAttention");
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    const int64_t bsz = in.size(0);
    const int64_t seq = in.size(1);
    const int64_t qk_head_dim = qk_nope_head_dim + qk_rope_head_dim;
    const at::Tensor& positions = nn::attention_context().positions;
    // -1 heads: a tensor-parallel rank holds a slice of them.
    const at::Tensor q_flat = wq ? wq->forward(in) : wq_b->forward(q_norm->forward(wq_a->forward(in)));
    at::Tensor q = q_flat.view({bsz, seq, -1, qk_head_dim});  // (B, S, H, NOPE+ROPE)
    q = at::cat({q.narrow(-1, 0, qk_nope_head_dim),
                 nn::apply_rope(q.narrow(-1, qk_nope_head_dim, qk_rope_head_dim), rope, positions)},
                -1);  // (B, S, H, NOPE+ROPE)
    // softmax(q k^T * mscale / sqrt(NOPE+ROPE)) = softmax((mscale q) k^T / sqrt(NOPE+ROPE)): the
    // attention kernels keep their default scale.
    if (softmax_mscale != 1.0) q = q * softmax_mscale;

    const at::Tensor kv_a = wkv_a->forward(in);  // (B, S, KVR+ROPE)
    const at::Tensor k_pe = nn::apply_rope(kv_a.narrow(-1, kv_lora_rank, qk_rope_head_dim).unsqueeze(2), rope,
                                           positions);  // (B, S, 1, ROPE)
    const at::Tensor kv = wkv_b->forward(kv_norm->forward(kv_a.narrow(-1, 0, kv_lora_rank)))
                              .view({bsz, seq, -1, qk_nope_head_dim + v_head_dim});  // (B, S, H, NOPE+V)
    const int64_t heads = kv.size(2);
    const at::Tensor k =
        at::cat({kv.narrow(-1, 0, qk_nope_head_dim), k_pe.expand({-1, -1, heads, -1})}, -1);  // (B, S, H, NOPE+ROPE)
    at::Tensor v = kv.narrow(-1, qk_nope_head_dim, v_head_dim);                               // (B, S, H, V)
    if (v_head_dim < qk_head_dim) v = at::constant_pad_nd(v, {0, qk_head_dim - v_head_dim});  // (B, S, H, NOPE+ROPE)

    const at::Tensor out =
        nn::causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));          // (B, H, S, NOPE+ROPE)
    return wo->forward(out.narrow(-1, 0, v_head_dim).transpose(1, 2).reshape({bsz, seq, -1}));  // (B, S, D)
  });
}

void MultiLatentAttention::init_weights(double out_std) {
  for (const auto& linear : {wkv_a, wkv_b, wq_a, wq_b, wq}) {
    if (linear) nn::trunc_normal_(linear->weight, 0.0, kInStd, kCutLow, kCutHigh);
  }
  nn::trunc_normal_(wo->weight, 0.0, out_std, kCutLow, kCutHigh);
  kv_norm->reset_parameters();
  if (q_norm) q_norm->reset_parameters();
}

// ---- block ---------------------------------------------------------------------------------------

TransformerBlock::TransformerBlock(int64_t layer_id_, const DeepSeekV3Args& args, double softmax_mscale,
                                   const at::TensorOptions& options)
    : layer_id(layer_id_), init_std(0.02 / std::sqrt(2.0 * static_cast<double>(layer_id_ + 1))) {
  attention_norm = register_module("attention_norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  attention = register_module("attention", std::make_shared<MultiLatentAttention>(args, softmax_mscale, options));
  ffn_norm = register_module("ffn_norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  if (layer_id < args.n_dense_layers) {
    feed_forward =
        register_module("feed_forward", std::make_shared<nn::FeedForward>(args.dim, args.inter_dim, options));
  } else {
    moe = register_module("moe", std::make_shared<nn::MoE>(args.moe, args.dim, args.moe_inter_dim, options));
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

// ---- model ---------------------------------------------------------------------------------------

DeepSeekV3::DeepSeekV3(const DeepSeekV3Args& args, int64_t seq_len, const at::TensorOptions& options,
                       const std::vector<std::string>& modules)
    : args_(args), seq_len_(seq_len) {
  TITAN_CHECK_VALUE(seq_len > 0 && seq_len <= args.max_seq_len,
                    "[titan::deepseek_v3] expected training.seq_len in [1, {}] (the model's max_seq_len), got {}. "
                    "Lower training.seq_len.",
                    args.max_seq_len, seq_len);
  TITAN_CHECK_VALUE(args.n_dense_layers >= 0 && args.n_dense_layers <= args.n_layers,
                    "[titan::deepseek_v3] expected 0 <= n_dense_layers <= n_layers ({}), got {}. Fix the model args.",
                    args.n_layers, args.n_dense_layers);
  const models::ModelParts part(modules, args.n_layers, /*tied=*/false, "titan::deepseek_v3");
  if (part.holds("tok_embeddings")) {
    tok_embeddings =
        register_module("tok_embeddings", std::make_shared<nn::Embedding>(args.vocab_size, args.dim, options));
  }
  const double mscale = args.softmax_mscale(seq_len);
  auto container = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args.n_layers; ++i) {
    if (!part.holds("layers." + std::to_string(i))) continue;
    layers.push_back(
        container->register_module(std::to_string(i), std::make_shared<TransformerBlock>(i, args, mscale, options)));
  }
  if (part.holds("norm"))
    norm = register_module("norm", std::make_shared<nn::RMSNorm>(args.dim, args.norm_eps, options));
  if (part.holds("output")) {
    output = register_module("output", std::make_shared<nn::Linear>(args.dim, args.vocab_size, options));
  }
  if (options.device().type() != at::kMeta) {
    // Derived, not parameters: rebuilt on the model's device, never checkpointed.
    const bool yarn = args.uses_yarn(seq_len);
    const at::Tensor freqs =
        yarn ? nn::yarn_frequencies({.head_dim = args.qk_rope_head_dim,
                                     .theta = args.rope_theta,
                                     .factor = args.rope_factor,
                                     .original_max_positions = args.original_seq_len,
                                     .beta_fast = args.beta_fast,
                                     .beta_slow = args.beta_slow})
             : nn::rope_frequencies(
                   {.head_dim = args.qk_rope_head_dim, .theta = args.rope_theta, .llama3_scaling = false});  // (ROPE/2)
    rope_ = nn::make_rope_tables(freqs, seq_len, options.device(), yarn ? args.yarn_attention_factor : 1.0);
  }
}

at::Tensor DeepSeekV3::forward(const at::Tensor& tokens) const {
  TITAN_CHECK_VALUE(tokens.dim() == 2 && tokens.size(1) <= seq_len_,
                    "[titan::deepseek_v3] expected tokens of shape (B, S<={}), got {}.", seq_len_,
                    c10::str(tokens.sizes()));
  TITAN_CHECK(tok_embeddings && norm && output && static_cast<int64_t>(layers.size()) == args_.n_layers,
              "[titan::deepseek_v3] expected the whole model in forward(), got a part of {} blocks. Run a part "
              "with forward_part(x, modules).",
              layers.size());
  std::vector<std::string> all{"tok_embeddings"};
  for (const auto& layer : layers) all.push_back("layers." + std::to_string(layer->layer_id));
  all.insert(all.end(), {"norm", "output"});
  return forward_part(tokens, all);
}

at::Tensor DeepSeekV3::forward_part(const at::Tensor& x, const std::vector<std::string>& modules) const {
  TITAN_CHECK(rope_.freqs_cis.defined(),
              "[titan::deepseek_v3] expected a model on a real device, got one on meta. Build it with a device "
              "(DeepSeekV3::build(config, 0, device)) and call init_weights().");
  at::Tensor h = x;  // tokens (B, S), then (B, S, D), logits (B, S, V) after "output"
  for (const auto& path : modules) {
    if (path == "tok_embeddings" && tok_embeddings) {
      h = tok_embeddings->forward(h);
    } else if (path == "norm" && norm) {
      h = norm->forward(h);
    } else if (path == "output" && output) {
      h = output->forward(h);
    } else {
      const int64_t index = models::ModelParts::layer_index(path);
      auto it = std::find_if(layers.begin(), layers.end(), [&](const auto& l) { return l->layer_id == index; });
      TITAN_CHECK_VALUE(index >= 0 && it != layers.end(),
                        "[titan::deepseek_v3] expected forward_part modules held by this part, got '{}'. Build "
                        "the part with the stage's modules.",
                        path);
      h = (*it)->forward(h, rope_);
    }
  }
  return h;
}

void DeepSeekV3::init_weights() {
  // A part skips the init streams of the modules it lacks, so its weights are the whole model's.
  // Stream counts of a missing block: attention (wkv_a, wkv_b, wq or wq_a + wq_b, wo), then a dense
  // SwiGLU (w1, w2, w3) or an MoE (experts w1, w2, w3, router gate, shared w1, w2, w3).
  const int64_t attention_streams = args_.q_lora_rank == 0 ? 4 : 5;
  const int64_t moe_streams = 4 + (args_.moe.num_shared_experts > 0 ? 3 : 0);
  if (tok_embeddings) {
    nn::normal_(tok_embeddings->weight, 0.0, 1.0);
  } else {
    nn::skip_init_streams(1);
  }
  auto next = layers.begin();
  for (int64_t i = 0; i < args_.n_layers; ++i) {
    if (next != layers.end() && (*next)->layer_id == i) {
      (*next++)->init_weights();
    } else {
      nn::skip_init_streams(attention_streams + (i < args_.n_dense_layers ? 3 : moe_streams));
    }
  }
  if (norm) norm->reset_parameters();
  const double out_std = 1.0 / std::sqrt(static_cast<double>(args_.dim));
  if (output) nn::trunc_normal_(output->weight, 0.0, out_std, -3 * out_std, 3 * out_std);
}

std::vector<at::Tensor> DeepSeekV3::unique_parameters() const { return models::unique_parameters(*this); }

int64_t DeepSeekV3::num_params() const {
  int64_t n = 0;
  for (const auto& p : unique_parameters()) n += p.numel();
  return n;
}

int64_t DeepSeekV3::num_flops_per_token(int64_t seq_len) const {
  // torchtitan's get_moe_model_nparams_and_flops: the embedding lookup is no matmul.
  const models::ParameterGroups g = models::parameter_groups(*this);
  const int64_t active =
      g.dense + g.router + g.shared_experts + g.routed_experts * args_.moe.top_k / args_.moe.num_experts;
  const int64_t head_dims = args_.qk_head_dim() + args_.v_head_dim;
  return 6 * active + 6 * args_.n_layers * args_.n_heads * head_dims * seq_len;
}

std::vector<std::shared_ptr<nn::MoE>> DeepSeekV3::moe_layers() const {
  std::vector<std::shared_ptr<nn::MoE>> out;
  for (const auto& layer : layers) {
    if (layer->moe) out.push_back(layer->moe);
  }
  return out;
}

}  // namespace titan::deepseek_v3
