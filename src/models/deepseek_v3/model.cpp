// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/models/detail/family_args.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "titan/core/error.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/nn/generate.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/kv_cache.hpp"
#include "titan/nn/sequence_attention.hpp"

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

MultiLatentAttention::Heads MultiLatentAttention::heads(const at::Tensor& in, const nn::RopeTables& rope,
                                                        const at::Tensor& positions) const {
  const int64_t bsz = in.size(0);
  const int64_t seq = in.size(1);
  const int64_t qk_head_dim = qk_nope_head_dim + qk_rope_head_dim;
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
  return {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)};
}

at::Tensor MultiLatentAttention::output(const at::Tensor& attended) const {
  // attended (B, H, S, NOPE+ROPE): the value dims are the first V.
  return wo->forward(attended.narrow(-1, 0, v_head_dim).transpose(1, 2).flatten(2));  // (B, S, D)
}

at::Tensor MultiLatentAttention::forward(const at::Tensor& x, const nn::RopeTables& rope,
                                         const nn::AttentionContext& context) const {
  check_attention_context(context, "titan::deepseek_v3::MultiLatentAttention");
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    const Heads h = heads(in, rope, context.positions);
    return output(nn::causal_attention(h.q, h.k, h.v, context));
  });
}

at::Tensor MultiLatentAttention::forward_cached(const at::Tensor& x, const nn::RopeTables& rope,
                                                const at::Tensor& positions, const at::Tensor& mask, nn::KVCache& cache,
                                                int64_t layer) const {
  // The cache holds every head's decompressed keys and values (not the latent): the simple form.
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    const Heads h = heads(in, rope, positions);
    const auto [keys, values] = cache.append(layer, h.k, h.v);  // (B, H, T, NOPE+ROPE)
    return output(nn::cached_attention(h.q, keys, values, mask));
  });
}

void MultiLatentAttention::init_weights(const nn::InitSite& site, double out_std) {
  for (const auto& [name, linear] :
       {std::pair{"wkv_a", wkv_a}, {"wkv_b", wkv_b}, {"wq_a", wq_a}, {"wq_b", wq_b}, {"wq", wq}}) {
    if (linear) nn::trunc_normal_(linear->weight, site / name / "weight", 0.0, kInStd, kCutLow, kCutHigh);
  }
  nn::trunc_normal_(wo->weight, site / "wo.weight", 0.0, out_std, kCutLow, kCutHigh);
  kv_norm->reset_parameters();
  if (q_norm) q_norm->reset_parameters();
}

// ---- model ---------------------------------------------------------------------------------------

models::DecoderShape decoder_shape(const DeepSeekV3Args& args) {
  const bool q_lora = args.q_lora_rank > 0;
  models::DecoderShape shape{
      .where = "titan::deepseek_v3",
      .vocab_size = args.vocab_size,
      .dim = args.dim,
      .n_layers = args.n_layers,
      .n_heads = args.n_heads,
      .n_kv_heads = args.n_heads,
      .head_dim = args.qk_head_dim(),
      .v_head_dim = args.v_head_dim,
      .norm_eps = args.norm_eps,
      .max_seq_len = args.max_seq_len,
      .head_projections = {q_lora ? "wq_b" : "wq", "wkv_b"},
      .replicated_attention = q_lora ? std::vector<std::string>{"wq_a", "q_norm", "wkv_a", "kv_norm"}
                                     : std::vector<std::string>{"wkv_a", "kv_norm"},
      .shared_experts = args.moe.num_shared_experts > 0,
      .moe_top_k = args.moe.top_k,
      .moe_num_experts = args.moe.num_experts};
  for (int64_t i = args.n_dense_layers; i < args.n_layers; ++i) shape.moe_layers.push_back(i);
  return shape;
}

namespace {
const DeepSeekV3Args& validated(const DeepSeekV3Args& args) {
  TITAN_CHECK_VALUE(args.n_dense_layers >= 0 && args.n_dense_layers <= args.n_layers,
                    "[titan::deepseek_v3] expected 0 <= n_dense_layers <= n_layers ({}), got {}. Fix the model args.",
                    args.n_layers, args.n_dense_layers);
  TITAN_CHECK_VALUE(args.num_nextn_predict_layers >= 0,
                    "[titan::deepseek_v3] expected num_nextn_predict_layers >= 0, got {}. Fix the model args "
                    "(model.num_nextn_predict_layers; 0: no multi-token prediction).",
                    args.num_nextn_predict_layers);
  return args;
}
}  // namespace

namespace {
// Block `layer`'s parts: MLA, then a dense SwiGLU for the first n_dense_layers, an MoE layer after (the
// multi-token prediction blocks, numbered after the model's, are MoE blocks as in Hugging Face's numbering).
models::DecoderBlock::Parts block_parts(const DeepSeekV3Args& args, int64_t seq_len, const at::TensorOptions& options,
                                        int64_t layer) {
  models::DecoderBlock::Parts parts{
      .attention = std::make_shared<MultiLatentAttention>(args, args.softmax_mscale(seq_len), options),
      .init_std = 0.02 / std::sqrt(2.0 * static_cast<double>(layer + 1))};
  if (layer < args.n_dense_layers) {
    parts.feed_forward = std::make_shared<nn::FeedForward>(args.dim, args.inter_dim, options);
  } else {
    parts.moe = std::make_shared<nn::MoE>(args.moe, args.dim, args.moe_inter_dim, options);
  }
  return parts;
}
}  // namespace

namespace {
// A pipeline stage's modules less "mtp", which comes with "norm": the decoder's own parts.
std::vector<std::string> decoder_parts(std::vector<std::string> modules) {
  std::erase(modules, "mtp");
  return modules;
}
}  // namespace

DeepSeekV3::DeepSeekV3(const DeepSeekV3Args& args, int64_t seq_len, const at::TensorOptions& options,
                       const std::vector<std::string>& modules)
    : Decoder(decoder_shape(validated(args)), seq_len, options, decoder_parts(modules),
              [&](int64_t layer) { return block_parts(args, seq_len, options, layer); }),
      args_(args) {
  if (args.num_nextn_predict_layers > 0 && norm) {
    mtp = register_module("mtp", std::make_shared<models::MultiTokenPrediction>(
                                     args.num_nextn_predict_layers, args.mtp_loss_scaling_factor, shape(), options,
                                     [&](int64_t layer) { return block_parts(args, seq_len, options, layer); }));
    // A pipeline's last stage embeds t_{i+k} with a copy of the first stage's embedding (Megatron's tied embedding on
    // the first and last stage); a rank that holds both stages reads the one embedding.
    if (!tok_embeddings) mtp->hold_embedding_copy(args.vocab_size, args.dim, options);
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
    set_rope(nn::make_rope_tables(freqs, seq_len, options.device(), yarn ? args.yarn_attention_factor : 1.0));
  }
}

at::Tensor DeepSeekV3::after_blocks(const at::Tensor& h, const at::Tensor& tokens,
                                    const nn::AttentionContext& context) const {
  if (!mtp) return h;
  // A pipeline's last stage does not embed: the trainer hands it the microbatch's tokens (MtpLoss::labelled).
  const at::Tensor& input = tokens.defined() ? tokens : mtp->tokens;  // (B, S)
  if (!input.defined()) {
    TITAN_CHECK(!c10::GradMode::is_enabled(),
                "[titan::deepseek_v3] expected the microbatch's input tokens on the pipeline's last stage "
                "(MultiTokenPrediction::tokens) for the multi-token prediction loss, got none. Run the step's model "
                "through MtpLoss::labelled (or set mtp->tokens before each last-stage forward).");
    return h;  // no loss to add without grad
  }
  // The main model's head, shared: the same module (so the same FSDP unit and tensor-parallel role) reads it.
  return mtp->forward(
      h, input, tok_embeddings ? *tok_embeddings : *mtp->embedding,
      [this](const at::Tensor& x) { return output->forward(x); }, rope(), context);
}

nn::DraftingModel DeepSeekV3::drafting_model() const {
  TITAN_CHECK_VALUE(mtp != nullptr && tok_embeddings && output,
                    "[titan::deepseek_v3::drafting_model] expected a whole model with multi-token prediction modules, "
                    "got none. Set model.num_nextn_predict_layers to the checkpoint's depth.");
  std::vector<std::string> blocks{"tok_embeddings"};
  for (const auto& layer : layers) blocks.push_back("layers." + std::to_string(layer->layer_id));
  const auto head = [this](const at::Tensor& x) { return output->forward(x); };
  return {.forward =
              [this, blocks](const at::Tensor& tokens) {
                at::NoGradGuard no_grad;
                at::Tensor h = forward_part(tokens, blocks);  // (1, T, D): before the final norm
                return std::pair{h, output->forward(norm->forward(h))};
              },
          .draft = [this, head](
                       const at::Tensor& hidden,
                       const at::Tensor& tokens) { return mtp->draft(hidden, tokens, *tok_embeddings, head, rope()); },
          .depth = static_cast<int64_t>(mtp->modules.size())};
}

void DeepSeekV3::init_extra_weights(const nn::InitSite& root) {
  if (!mtp) return;
  mtp->init_weights(root / "mtp");
  // The copy draws what the first stage's tok_embeddings draws (the init follows the site, not the layout): equal.
  if (mtp->embedding) nn::normal_(mtp->embedding->weight, root / "tok_embeddings.weight", 0.0, 1.0);
}

parallel::ShardingSpec DeepSeekV3::sharding_spec() const {
  parallel::ShardingSpec spec = Decoder::sharding_spec();
  if (!mtp) return spec;
  // The depths run after the blocks and before norm + output, the last unit: theirs go in front of it.
  std::vector<std::vector<std::string>> units;
  for (size_t k = 0; k < mtp->modules.size(); ++k) {
    const std::string at = "mtp." + std::to_string(k);
    const std::string block = at + ".block";
    if (!mtp->modules[k]->block->moe) {
      units.push_back({at});
      continue;
    }
    std::vector<std::string> dense{
        at + ".enorm",        at + ".hnorm",       at + ".eh_proj",       block + ".attention_norm",
        block + ".attention", block + ".ffn_norm", block + ".moe.router", at + ".norm"};
    parallel::MoeModule moe{.path = block + ".moe", .replicated = {"router"}};
    if (args_.moe.num_shared_experts > 0) {
      dense.push_back(block + ".moe.shared_experts");
      moe.replicated.push_back("shared_experts");
    }
    units.push_back(std::move(dense));
    units.push_back({block + ".moe.experts"});
    spec.moe.push_back(std::move(moe));
  }
  spec.fsdp_units.insert(spec.fsdp_units.end() - 1, units.begin(), units.end());
  spec.refused.push_back({"tp",
                          "multi-token prediction under tensor parallelism is not built (its block, and its loss on "
                          "vocabulary-sharded logits). Set model.num_nextn_predict_layers 0, or use data and expert "
                          "parallelism."});
  // The depths run after the last block: on the last stage, with the tokens the trainer hands it and a copy of the
  // first stage's embedding (mtp.embedding, in the root FSDP unit: sharded as tok_embeddings is).
  spec.pipeline.output_modules.insert(spec.pipeline.output_modules.begin(), "mtp");
  // Depth k reads token t_{i+k} at position i: under cp that token may lie in another rank's part of the sequence.
  spec.refused.push_back({"cp",
                          "multi-token prediction under context parallelism is not built: the tokens ahead of a "
                          "rank's part of the sequence lie on the next cp rank. Set model.num_nextn_predict_layers "
                          "0, or use data and expert parallelism."});
  return spec;
}

std::shared_ptr<DeepSeekV3> DeepSeekV3::build(const DeepSeekV3Args& args, const ModelBuild& where) {
  return models::detail::build_family<DeepSeekV3>(args, where);
}

}  // namespace titan::deepseek_v3
