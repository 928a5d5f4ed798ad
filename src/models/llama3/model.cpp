// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/llama3/model.hpp"
#include "titan/models/detail/family_args.hpp"

#include <cmath>

namespace titan::llama3 {
namespace {

models::DecoderShape shape_of(const Llama3Args& args) {
  return {.where = "titan::llama3",
          .vocab_size = args.vocab_size,
          .dim = args.dim,
          .n_layers = args.n_layers,
          .n_heads = args.n_heads,
          .n_kv_heads = args.kv_heads(),
          .head_dim = args.head_dim(),
          .v_head_dim = args.head_dim(),
          .norm_eps = args.norm_eps,
          .max_seq_len = args.max_seq_len,
          .tied = args.tie_word_embeddings};
}

}  // namespace

Llama3::Llama3(const Llama3Args& args, int64_t seq_len, const at::TensorOptions& options,
               const std::vector<std::string>& modules)
    : Decoder(shape_of(args), seq_len, options, modules,
              [&](int64_t layer) {
                const double depth =
                    args.depth_init ? static_cast<double>(layer + 1) : static_cast<double>(args.n_layers);
                return models::DecoderBlock::Parts{
                    .attention = std::make_shared<nn::Attention>(args.dim, args.n_heads, args.kv_heads(), options),
                    .feed_forward = std::make_shared<nn::FeedForward>(args.dim, args.ffn_hidden_dim(), options),
                    .init_std = 0.02 / std::sqrt(2.0 * depth)};
              }),
      args_(args) {
  if (options.device().type() != at::kMeta) {
    set_rope(nn::make_rope_tables({.head_dim = args.head_dim(),
                                   .max_positions = seq_len,
                                   .theta = args.rope_theta,
                                   .llama3_scaling = args.rope_scaling},
                                  options.device()));
  }
}

std::shared_ptr<Llama3> Llama3::build(const Llama3Args& args, const ModelBuild& where) {
  return models::detail::build_family<Llama3>(args, where);
}

}  // namespace titan::llama3
