// SPDX-License-Identifier: BSD-3-Clause
// The decoder skeleton every bundled family shares, written once: token embeddings, blocks (pre-norm
// attention and feed-forward with residuals), the final norm, the output projection (or the tied
// embedding), RoPE tables, pipeline parts (`forward_part`), init, parameter and FLOP counts, and the
// KV-cache forward. A family supplies its shape (models/decoder_shape.hpp), each block's attention and
// feed-forward, and its RoPE tables:
//
//   class MyModel : public models::Decoder {
//     MyModel(const MyArgs& a, int64_t seq_len, const at::TensorOptions& o, const std::vector<std::string>& parts)
//         : Decoder(shape_of(a), seq_len, o, parts, [&](int64_t layer) {
//             return DecoderBlock::Parts{.attention = std::make_shared<nn::Attention>(...),
//                                        .feed_forward = std::make_shared<nn::FeedForward>(...),
//                                        .init_std = 0.02};
//           }) { if (o.device().type() != at::kMeta) set_rope(nn::make_rope_tables(...)); }
//   };
//
// Parameter names are torchtitan's: tok_embeddings.weight, layers.N.{attention_norm, attention, ffn_norm,
// feed_forward | moe}.*, norm.weight, output.weight. Each parameter's initial values depend only on
// the init seed and that name (nn/init.hpp), so a model split any way initialises as the whole model.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/models/decoder_shape.hpp"
#include "titan/models/trainable_model.hpp"
#include "titan/nn/attention.hpp"
#include "titan/nn/attention_context.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/moe.hpp"
#include "titan/nn/rope.hpp"
#include "titan/parallel/sharding_spec.hpp"

namespace titan::checkpoint {
class HfAdapter;
}
namespace titan::nn {
class KVCache;
}

namespace titan::models {

/// One block: h = x + attention(attention_norm(x)); out = h + ffn(ffn_norm(h)), ffn dense or MoE.
class DecoderBlock : public torch::nn::Module {
 public:
  /// What a family builds for block `layer_id`: its attention and exactly one of feed_forward / moe.
  struct Parts {
    /// The attention sublayer (registered as `attention`).
    std::shared_ptr<nn::AttentionLayer> attention{};
    /// A dense feed-forward (registered as `feed_forward`), or null.
    std::shared_ptr<nn::FeedForward> feed_forward{};
    /// An MoE feed-forward (registered as `moe`), or null.
    std::shared_ptr<nn::MoE> moe{};
    /// Std of the block's output projections (wo, w2, w3, the router gate).
    double init_std = 0.02;
  };
  DecoderBlock(int64_t layer_id, Parts parts, const DecoderShape& shape, const at::TensorOptions& options);
  /// x (B, S, D) -> (B, S, D); checkpointed when the plan marks the block (the recompute keeps `context`).
  at::Tensor forward(const at::Tensor& x, const nn::RopeTables& rope, const nn::AttentionContext& context) const;
  /// Inference over a KV cache (see Decoder::forward_cached).
  at::Tensor forward_cached(const at::Tensor& x, const nn::RopeTables& rope, const at::Tensor& positions,
                            const at::Tensor& mask, nn::KVCache& cache) const;
  /// Fills the block's weights; `site` names the block ("layers.N").
  void init_weights(const nn::InitSite& site);
  /// The attention as the family's type (nullptr if it is another).
  template <class A>
  std::shared_ptr<A> attention_as() const {
    return std::dynamic_pointer_cast<A>(attention);
  }

  int64_t layer_id;
  double init_std;
  std::shared_ptr<nn::RMSNorm> attention_norm;    // weight (D)
  std::shared_ptr<nn::AttentionLayer> attention;  // the family's
  std::shared_ptr<nn::RMSNorm> ffn_norm;          // weight (D)
  std::shared_ptr<nn::FeedForward> feed_forward;  // dense blocks; null in an MoE block
  std::shared_ptr<nn::MoE> moe;                   // MoE blocks; null in a dense block
};

/// A registered family's model, as the registry builds it: the arguments of Trainer<models::Decoder>.
struct DecoderArgs {
  /// The family (model.name): "llama3", "qwen3", "qwen3_5", "qwen3_5_moe", "deepseek_v3", "gpt_oss" or one added
  /// with register_model.
  std::string family = "llama3";
  /// Its flavor (model.flavor).
  std::string flavor = "debugmodel";
  /// Longest sequence, the RoPE tables' length; 0 keeps the flavor's max_seq_len (a job sets training.seq_len).
  int64_t max_seq_len = 0;
  /// Vocabulary size; 0 keeps the flavor's.
  int64_t vocab_size = 0;
  /// Weight of DeepSeek-V3's sequence-wise auxiliary balance loss; 0: none (MoE families only).
  double moe_load_balance_loss_weight = 0;
  /// DeepSeek-V3's multi-token prediction depth (num_nextn_predict_layers); 0: the flavor's (MTP families only).
  int64_t num_nextn_predict_layers = 0;
  /// Weight lambda of the multi-token prediction loss, with num_nextn_predict_layers > 0.
  double mtp_loss_scaling_factor = 0.1;
};

class Decoder : public torch::nn::Module {
 public:
  using Args = DecoderArgs;
  using BlockFactory = std::function<DecoderBlock::Parts(int64_t layer_id)>;
  /// Builds the model with uninitialised parameters; `seq_len` must not exceed shape.max_seq_len.
  /// With `modules` (top-level paths: "tok_embeddings", "layers.N", "norm", "output") only those
  /// are built: a pipeline rank's part, with the whole model's names.
  Decoder(DecoderShape shape, int64_t seq_len, const at::TensorOptions& options,
          const std::vector<std::string>& modules, const BlockFactory& make_block);

  /// The family `args.family` from the registry (models/model_spec.hpp), built where `where` says. With it
  /// `Trainer<models::Decoder>` trains any registered family.
  static std::shared_ptr<Decoder> build(const DecoderArgs& args, const ModelBuild& where = {});
  /// How the model may be sharded: models::decoder_sharding_spec of its shape, with its pipeline costs when the
  /// model is whole. A family with exceptions overrides it.
  virtual parallel::ShardingSpec sharding_spec() const;
  /// Maps the model to and from its Hugging Face twin; nullptr (the default): none.
  virtual std::shared_ptr<const checkpoint::HfAdapter> hf_adapter() const;

  /// tokens (B, S) int64 -> logits (B, S, V) in the parameter dtype. `context`: the tokens' positions,
  /// documents and context-parallel split; none = causal attention over positions 0..S-1.
  at::Tensor forward(const at::Tensor& tokens, const nn::AttentionContext& context = {}) const;
  /// Runs `modules` in order on x: tokens (B, S) before "tok_embeddings", hidden states (B, S, D)
  /// after it; "output" returns the logits (B, S, V). One pipeline stage's forward.
  at::Tensor forward_part(const at::Tensor& x, const std::vector<std::string>& modules,
                          const nn::AttentionContext& context = {}) const;
  /// Inference with a KV cache (nn/kv_cache.hpp): tokens (B, S) are the next S columns of `cache`
  /// (the left-padded prompts, then one token per step); returns their logits (B, S, V), replicated
  /// under tensor parallelism without loss parallel. No autograd.
  at::Tensor forward_cached(const at::Tensor& tokens, nn::KVCache& cache) const;
  /// torchtitan's init scheme from the calling thread's init seed (nn::manual_init_seed).
  void init_weights();
  /// The same from `root` (its seed; its name prefixes every parameter's).
  void init_weights(const nn::InitSite& root);
  /// Parameters without duplicates (tied weights once), in registration order.
  std::vector<at::Tensor> unique_parameters() const;
  /// Number of parameters of the modules this model holds, every expert included (tied weights once), from their
  /// global shapes: the same before and after parallelize.
  int64_t num_params() const;
  /// torchtitan's training FLOPs per token: 6 * (non-embedding parameters, of the routed experts the
  /// top_k / num_experts active share; a tied embedding counts as the output matmul it also is) + each block's
  /// attention_flops_per_token (models/decoder_spec.hpp): 6 * L * H * (head_dim + v_head_dim) * S without linear
  /// attention.
  int64_t num_flops_per_token(int64_t seq_len) const;
  /// The MoE layers this part holds, in block order (for expert-bias updates and load logging).
  std::vector<std::shared_ptr<nn::MoE>> moe_layers() const;

  int64_t vocab_size() const { return shape_.vocab_size; }
  int64_t seq_len() const { return seq_len_; }
  const DecoderShape& shape() const { return shape_; }

  std::shared_ptr<nn::Embedding> tok_embeddings;      // weight (V, D); null in a part without it
  std::vector<std::shared_ptr<DecoderBlock>> layers;  // registered as layers.<layer_id>; a part's only
  std::shared_ptr<nn::RMSNorm> norm;                  // weight (D); null in a part without it
  std::shared_ptr<nn::Linear> output;                 // weight (V, D); null when tied or not in the part

 protected:
  /// The RoPE tables of the family (derived, not parameters): set on a real device, never on meta.
  void set_rope(nn::RopeTables rope) { rope_ = std::move(rope); }
  const nn::RopeTables& rope() const { return rope_; }
  /// A family's objective beyond the next token (DeepSeek-V3's multi-token prediction): forward_part calls it on
  /// the last block's output h (B, S, D), before the final norm, with the tokens (B, S) when the same part embedded
  /// them (undefined on a pipeline's last stage, which does not). It returns h, which may carry an injected loss
  /// (nn::detail::inject_aux_loss). Default: h. A stage's module list may name the family's modules ("mtp"):
  /// forward_part leaves them to after_blocks.
  virtual at::Tensor after_blocks(const at::Tensor& h, const at::Tensor& tokens,
                                  const nn::AttentionContext& context) const;
  /// Initialises the modules a family registered beyond the decoder's, from `root`. Default: none.
  virtual void init_extra_weights(const nn::InitSite& root);

 private:
  const DecoderBlock& block(const std::string& path) const;

  DecoderShape shape_;
  int64_t seq_len_;
  nn::RopeTables rope_;  // freqs_cis (S, rope dims / 2)
};

}  // namespace titan::models

static_assert(titan::TrainableModel<titan::models::Decoder>,
              "models::Decoder (any registered family, Trainer<models::Decoder>) must satisfy TrainableModel");
