// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/multi_token_prediction.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>

#include "titan/core/error.hpp"
#include "titan/nn/loss.hpp"
#include "titan/nn/moe.hpp"

namespace titan::models {
namespace {

// x (B, S) shifted left by n positions, the last n filled with `fill`: column i holds x[:, i + n].
at::Tensor mtp_shift_left(const at::Tensor& x, int64_t n, int64_t fill) {
  const int64_t seq = x.size(1);
  if (n >= seq) return at::full_like(x, fill);
  return at::cat({x.narrow(1, n, seq - n), at::full({x.size(0), n}, fill, x.options())}, 1);
}

}  // namespace

MtpModule::MtpModule(std::shared_ptr<DecoderBlock> block_, const DecoderShape& shape,
                     const at::TensorOptions& options) {
  enorm = register_module("enorm", std::make_shared<nn::RMSNorm>(shape.dim, shape.norm_eps, options));
  hnorm = register_module("hnorm", std::make_shared<nn::RMSNorm>(shape.dim, shape.norm_eps, options));
  eh_proj = register_module("eh_proj", std::make_shared<nn::Linear>(2 * shape.dim, shape.dim, options));
  block = register_module("block", std::move(block_));
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(shape.dim, shape.norm_eps, options));
}

at::Tensor MtpModule::forward(const at::Tensor& prev, const at::Tensor& ahead, const nn::Embedding& embed,
                              const nn::RopeTables& rope, const nn::AttentionContext& context) const {
  // The checkpoint's order (DeepSeek's, read by vLLM and SGLang): the embedding's half of eh_proj first.
  const at::Tensor joined = at::cat({enorm->forward(embed.forward(ahead)), hnorm->forward(prev)}, -1);  // (B, S, 2D)
  return block->forward(eh_proj->forward(joined), rope, context);                                       // (B, S, D)
}

MultiTokenPrediction::MultiTokenPrediction(int64_t depth, double weight_, const DecoderShape& shape,
                                           const at::TensorOptions& options, const Decoder::BlockFactory& make_block)
    : weight(weight_) {
  TITAN_CHECK_VALUE(depth >= 1 && weight_ >= 0.0,
                    "[{}::MultiTokenPrediction] expected num_nextn_predict_layers >= 1 and mtp_loss_scaling_factor >= "
                    "0, got {} and {}. Fix the model args (0 layers: no multi-token prediction).",
                    shape.where, depth, weight_);
  for (int64_t k = 0; k < depth; ++k) {
    // Hugging Face numbers the depth's block after the model's: its dense-or-MoE choice and init follow that index.
    const int64_t layer_id = shape.n_layers + k;
    auto block = std::make_shared<DecoderBlock>(layer_id, make_block(layer_id), shape, options);
    modules.push_back(
        register_module(std::to_string(k), std::make_shared<MtpModule>(std::move(block), shape, options)));
  }
  loss = at::zeros({}, options.dtype(at::kFloat));  // a running sum, not state: never checkpointed
}

void MultiTokenPrediction::hold_embedding_copy(int64_t vocab_size, int64_t dim, const at::TensorOptions& options) {
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(vocab_size, dim, options));
}

at::Tensor MultiTokenPrediction::depth_losses(const at::Tensor& h, const at::Tensor& tokens, const nn::Embedding& embed,
                                              c10::function_ref<at::Tensor(const at::Tensor&)> head,
                                              const nn::RopeTables& rope, const nn::AttentionContext& context) const {
  TITAN_CHECK_VALUE(!labels.defined() || labels.sizes() == tokens.sizes(),
                    "[titan::MultiTokenPrediction] expected labels of the tokens' shape {}, got {}. Set labels to the "
                    "microbatch's own (or leave them undefined).",
                    c10::str(tokens.sizes()), c10::str(labels.sizes()));
  // Without labels, the tokens' own: label_i = t_{i+1}, so the shifts below give the targets t_{i+k+1}.
  const at::Tensor next = labels.defined() ? labels : mtp_shift_left(tokens, 1, kIgnoreIndex);  // (B, S)
  std::vector<at::Tensor> losses;                                                               // () each
  at::Tensor prev = h;                                                                          // (B, S, D): h^{k-1}
  for (size_t j = 0; j < modules.size(); ++j) {
    const MtpModule& m = *modules[j];
    const auto k = static_cast<int64_t>(j) + 1;
    // Column i: t_{i+k} in, label_{i+k} the target (its -100 too). The last k columns' inputs are filler: causal
    // attention keeps them out of every earlier position, and their targets are ignored.
    const at::Tensor ahead = mtp_shift_left(tokens, k, 0);             // (B, S)
    const at::Tensor targets = mtp_shift_left(next, k, kIgnoreIndex);  // (B, S)
    prev = m.forward(prev, ahead, embed, rope, context);               // (B, S, D): h^k
    losses.push_back(cross_entropy_sum(head(m.norm->forward(prev)), targets));
  }
  return at::stack(losses);  // (D)
}

at::Tensor MultiTokenPrediction::draft(const at::Tensor& h, const at::Tensor& tokens, const nn::Embedding& embed,
                                       c10::function_ref<at::Tensor(const at::Tensor&)> head,
                                       const nn::RopeTables& rope) const {
  TITAN_CHECK_VALUE(tokens.dim() == 2 && h.dim() == 3 && h.size(1) + 1 == tokens.size(1),
                    "[titan::MultiTokenPrediction::draft] expected h (B, T-1, D) for tokens (B, T), got h {} and "
                    "tokens {}. Pass the last block's output at every token but the last.",
                    c10::str(h.sizes()), c10::str(tokens.sizes()));
  at::NoGradGuard no_grad;
  const int64_t len = h.size(1);
  std::vector<at::Tensor> drafts;  // (B, 1) each
  at::Tensor prev = h;             // (B, T-1, D): h^{k-1}
  for (size_t j = 0; j < modules.size(); ++j) {
    const auto k = static_cast<int64_t>(j) + 1;
    // Position i reads t_{i+k} of the tokens followed by the drafts so far (depth k-1's at the last position).
    std::vector<at::Tensor> known{tokens};
    known.insert(known.end(), drafts.begin(), drafts.end());
    const at::Tensor ahead = at::cat(known, 1).narrow(1, k, len);                              // (B, T-1)
    prev = modules[j]->forward(prev, ahead, embed, rope, {});                                  // (B, T-1, D): h^k
    drafts.push_back(head(modules[j]->norm->forward(prev.narrow(1, len - 1, 1))).argmax(-1));  // (B, 1)
  }
  return at::cat(drafts, 1);  // (B, D)
}

at::Tensor MultiTokenPrediction::forward(const at::Tensor& h, const at::Tensor& tokens, const nn::Embedding& embed,
                                         c10::function_ref<at::Tensor(const at::Tensor&)> head,
                                         const nn::RopeTables& rope, const nn::AttentionContext& context) const {
  // Without grad (validation, evaluation, generation) there is no objective to add to.
  if (!c10::GradMode::is_enabled()) return h;
  const at::Tensor mean = depth_losses(h, tokens, embed, head, rope, context).sum().to(at::kFloat) *
                          (loss_scale / static_cast<double>(modules.size()));  // ()
  {
    at::NoGradGuard no_grad;
    loss.add_(mean.detach());
  }
  return nn::detail::inject_aux_loss(h, mean * weight);
}

void MultiTokenPrediction::init_weights(const nn::InitSite& site) {
  for (size_t k = 0; k < modules.size(); ++k) {
    MtpModule& m = *modules[k];
    const nn::InitSite here = site / std::to_string(k);
    m.enorm->reset_parameters();
    m.hnorm->reset_parameters();
    m.norm->reset_parameters();
    nn::trunc_normal_(m.eh_proj->weight, here / "eh_proj.weight", 0.0, 0.02, -2.0, 2.0);
    m.block->init_weights(here / "block");
  }
  at::NoGradGuard no_grad;
  loss.zero_();
}

std::vector<std::shared_ptr<MultiTokenPrediction>> mtp_modules(const torch::nn::Module& model) {
  std::vector<std::shared_ptr<MultiTokenPrediction>> out;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto mtp = std::dynamic_pointer_cast<MultiTokenPrediction>(m)) out.push_back(std::move(mtp));
  }
  return out;
}

}  // namespace titan::models
