// SPDX-License-Identifier: BSD-3-Clause
// Multi-token prediction (DeepSeek-V3 technical report, section 2.2): D modules after the decoder's blocks, module k
// (1-based) predicting token t_{i+k+1} at position i. Its input is the previous depth's hidden state h^{k-1}_i: the
// last block's output, before the final norm, for k = 1. Module k combines it with the shared embedding of t_{i+k}:
//   h'^k_i = eh_proj([hnorm(h^{k-1}_i); enorm(Emb(t_{i+k}))]),        eh_proj: (D, 2D)
//   h^k    = block_k(h'^k),                                            one decoder block of the model's kind
//   P^k    = head(norm_k(h^k)),                                        the model's own output head
// and the objective gains lambda / D * sum_k CE_k. As Megatron's MTP rolls the labels and their mask by k, depth k's
// target at position i is the next-token label label_{i+k} (= t_{i+k+1} where it is not -100): a position whose shifted
// label is -100 (an SFT prompt, a document's padding) or lies past the sequence adds nothing. The report's 1/T
// normalisation is the trainer's loss_scale: one over the step's valid labels, the next-token loss's own count. The
// loss enters through the hidden state h^0 (nn::detail::inject_aux_loss), so a trainer's loss function and the logits
// do not change and the logged next-token loss stays comparable to a run without MTP.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/FunctionRef.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "titan/models/decoder.hpp"

namespace titan::models {

/// One depth k of multi-token prediction (registered as mtp.<k-1>).
class MtpModule : public torch::nn::Module {
 public:
  /// `block`: the transformer block of this depth (layer id n_layers + k - 1, as Hugging Face numbers it).
  MtpModule(std::shared_ptr<DecoderBlock> block, const DecoderShape& shape, const at::TensorOptions& options);

  std::shared_ptr<nn::RMSNorm> enorm;   // weight (D): on the embedding of t_{i+k}
  std::shared_ptr<nn::RMSNorm> hnorm;   // weight (D): on the previous depth's hidden state
  std::shared_ptr<nn::Linear> eh_proj;  // weight (D, 2D): M_k of [hnorm(h); enorm(e)]
  std::shared_ptr<DecoderBlock> block;  // the depth's transformer block
  std::shared_ptr<nn::RMSNorm> norm;    // weight (D): the norm before the shared head (HF's shared_head.norm)

  /// h^k (B, S, D) of the previous depth's prev (B, S, D) and the tokens `ahead` (B, S) t_{i+k}.
  at::Tensor forward(const at::Tensor& prev, const at::Tensor& ahead, const nn::Embedding& embed,
                     const nn::RopeTables& rope, const nn::AttentionContext& context) const;
};

/// The D modules and their loss; a family registers it as "mtp" and calls forward from Decoder::after_blocks.
class MultiTokenPrediction : public torch::nn::Module {
 public:
  /// `depth` modules, the k-th with make_block(n_layers + k - 1)'s parts; `weight`: lambda.
  MultiTokenPrediction(int64_t depth, double weight, const DecoderShape& shape, const at::TensorOptions& options,
                       const Decoder::BlockFactory& make_block);

  /// h (B, S, D): the last block's output; tokens (B, S) the model's input, `labels` (set or not) the targets. With
  /// grad mode on, it returns h carrying
  /// loss_scale * weight / D * sum_k CE_k, and adds loss_scale / D * sum_k CE_k to `loss`. Without, h unchanged.
  /// `embed` and `head` are the model's shared embedding and output head; rope and context those of its blocks.
  at::Tensor forward(const at::Tensor& h, const at::Tensor& tokens, const nn::Embedding& embed,
                     c10::function_ref<at::Tensor(const at::Tensor&)> head, const nn::RopeTables& rope,
                     const nn::AttentionContext& context) const;
  /// Each module's norms to ones, eh_proj trunc-normal(0.02), its block as the model's blocks; `site`: "mtp".
  void init_weights(const nn::InitSite& site);
  /// The per-depth summed cross-entropies of forward (over the targets it counts), without injecting them: (D) fp32,
  /// for tests and evaluation.
  at::Tensor depth_losses(const at::Tensor& h, const at::Tensor& tokens, const nn::Embedding& embed,
                          c10::function_ref<at::Tensor(const at::Tensor&)> head, const nn::RopeTables& rope,
                          const nn::AttentionContext& context) const;

  /// Registers `embedding`, this part's copy of the model's tok_embeddings (V, D): a pipeline's last stage, which
  /// runs the depths without the first stage's embedding. The trainer keeps the copy equal to the first stage's
  /// (mtp_loss.hpp: its gradient summed with the original's, left out of the grad norm; the checkpoint's one key).
  void hold_embedding_copy(int64_t vocab_size, int64_t dim, const at::TensorOptions& options);

  /// Greedy drafts of the D tokens after `tokens` (B, T), for self-speculative decoding: h (B, T-1, D) is the last
  /// block's output at tokens' first T-1 positions (nothing after t_{T-1} reaches them); depth k reads h^{k-1} and
  /// the token k ahead, which at the last position is depth k-1's draft. Returns (B, D) int64; no autograd.
  at::Tensor draft(const at::Tensor& h, const at::Tensor& tokens, const nn::Embedding& embed,
                   c10::function_ref<at::Tensor(const at::Tensor&)> head, const nn::RopeTables& rope) const;

  std::vector<std::shared_ptr<MtpModule>> modules;  // depth k registered as "k-1"
  std::shared_ptr<nn::Embedding> embedding;         // weight (V, D): the last stage's copy of tok_embeddings, or null
  /// lambda: the weight of the mean depth loss in the objective.
  double weight;
  /// What one summed cross-entropy weighs in the objective: 1 (the default) adds the sums; the Trainer sets one over
  /// the valid labels of an optimizer step, the next-token loss's denominator, so a target weighs what a token does.
  double loss_scale = 1.0;
  /// The next-token labels (B, S) int64 (-100 = ignore) of the tokens the next forward with grad reads, or undefined:
  /// then labels from the tokens themselves (t_{i+1}; the last column has none), every position counting. The Trainer
  /// sets each microbatch's (MtpLoss::labelled); a shape other than the tokens' is refused.
  at::Tensor labels;
  /// The input tokens (B, S) int64 of the microbatch the next forward with grad reads, on a pipeline's last stage
  /// (only stage 0 receives them; the Trainer sets them, MtpLoss::labelled), or undefined where the model embeds them.
  at::Tensor tokens;
  /// loss_scale / D * sum_k CE_k of the forwards with grad since the last zeroing (() fp32, lambda not applied): the
  /// logged MTP loss.
  at::Tensor loss;
};

/// The MultiTokenPrediction modules of `model` (any depth of nesting), in registration order.
std::vector<std::shared_ptr<MultiTokenPrediction>> mtp_modules(const torch::nn::Module& model);

}  // namespace titan::models
