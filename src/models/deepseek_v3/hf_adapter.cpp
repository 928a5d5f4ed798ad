// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/deepseek_v3/hf_adapter.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <regex>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/nn/rope.hpp"

namespace titan::deepseek_v3 {
namespace {

// HF's fixed epsilon of q_a_layernorm and kv_a_layernorm.
constexpr double kHfLatentNormEps = 1e-6;

// Block-relative titan names -> HF names (after "model.layers.N.").
constexpr std::pair<const char*, const char*> kBlock[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
    {"moe.router.gate.weight", "mlp.gate.weight"},
    {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},
    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
};
// Stacked routed experts (E, ...) -> one HF tensor per expert: "mlp.experts.<e>." + this.
constexpr std::pair<const char*, const char*> kExperts[] = {
    {"moe.experts.w1", "gate_proj.weight"},
    {"moe.experts.w3", "up_proj.weight"},
    {"moe.experts.w2", "down_proj.weight"},
};

class DeepSeekV3HfAdapter final : public checkpoint::HfAdapter {
 public:
  DeepSeekV3HfAdapter(DeepSeekV3Args args, bool yarn, bool rope_interleave)
      : args_(std::move(args)), yarn_(yarn), rope_interleave_(rope_interleave) {}

  std::string hf_name(const std::string& fqn) const override {
    if (std::string outer = checkpoint::hf_outer_name(fqn); !outer.empty()) return outer;
    if (std::string own = mtp_own_name(fqn); !own.empty()) return own;
    const auto [layer, rest] = split_block(fqn);
    for (const auto& [titan_name, hf] : kBlock) {
      if (rest == titan_name) return fmt::format("model.layers.{}.{}", layer, hf);
    }
    for (const auto& [titan_name, hf] : kExperts) {
      if (rest == titan_name) return fmt::format("model.layers.{}.mlp.experts.<e>.{}", layer, hf);
    }
    TITAN_CHECK_VALUE(false, "[titan::deepseek_v3::hf_adapter] expected a DeepSeek-V3 parameter name, got '{}'.", fqn);
    return {};
  }

  at::Tensor to_hf(const std::string& fqn, const at::Tensor& w) const override {
    const int64_t head_rows = rope_interleave_ ? 0 : head_rows_of(fqn);
    return head_rows == 0 ? w : permute_rope(w, head_rows, checkpoint::rope_rows_to_hf);
  }

  at::Tensor from_hf(const std::string& fqn, const at::Tensor& w) const override {
    const int64_t head_rows = rope_interleave_ ? 0 : head_rows_of(fqn);
    return head_rows == 0 ? w : permute_rope(w, head_rows, checkpoint::rope_rows_from_hf);
  }

  std::vector<std::pair<std::string, at::Tensor>> to_hf_tensors(const std::string& fqn,
                                                                const at::Tensor& whole) const override {
    if (fqn == "tok_embeddings.weight" || fqn == "output.weight") {
      // DeepSeek's checkpoint stores each depth's copy of the shared embedding and head beside its own weights
      // (what vLLM and SGLang read); titan holds them once and reads the model's on import.
      auto out = HfAdapter::to_hf_tensors(fqn, whole);
      const char* copy = fqn == "output.weight" ? "shared_head.head.weight" : "embed_tokens.weight";
      for (int64_t k = 0; k < args_.num_nextn_predict_layers; ++k) {
        out.emplace_back(fmt::format("model.layers.{}.{}", args_.n_layers + k, copy), whole);
      }
      return out;
    }
    if (!is_experts(fqn)) return HfAdapter::to_hf_tensors(fqn, whole);
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (int64_t e = 0; e < whole.size(0); ++e) out.emplace_back(expert_name(fqn, e), whole[e]);
    return out;
  }

  at::Tensor read_hf(const std::string& fqn, const checkpoint::HfReader& reader) const override {
    if (!is_experts(fqn)) return HfAdapter::read_hf(fqn, reader);
    std::vector<at::Tensor> experts;
    for (int64_t e = 0; e < args_.moe.num_experts; ++e) experts.push_back(reader.read(expert_name(fqn, e)));
    return at::stack(experts);  // (E, ...)
  }

  nlohmann::json hf_config(at::ScalarType dtype) const override {
    const nn::MoEArgs& moe = args_.moe;
    TITAN_CHECK_NOT_IMPLEMENTED(
        moe.score_func == "sigmoid" && !moe.score_before_experts && moe.num_shared_experts > 0,
        "[titan::deepseek_v3::hf_adapter] expected sigmoid routing with the expert outputs weighted and shared "
        "experts (all transformers' DeepseekV3 can express), got score_func {}, score_before_experts {}, "
        "num_shared_experts {}. Export a model with DeepSeek-V3's routing (the 671B flavor's).",
        moe.score_func, moe.score_before_experts, moe.num_shared_experts);
    const double latent_eps = args_.latent_norm_eps.value_or(args_.norm_eps);
    if (latent_eps != kHfLatentNormEps) {
      log::warn(
          "[titan::deepseek_v3::hf_adapter] the latent norms (q_norm, kv_norm) use eps {}; transformers' "
          "DeepseekV3 uses {} there: its logits will differ slightly.",
          latent_eps, kHfLatentNormEps);
    }
    nlohmann::json rope = {{"rope_theta", args_.rope_theta}, {"rope_type", "default"}};
    if (yarn_) {
      rope = {{"rope_theta", args_.rope_theta},
              {"rope_type", "yarn"},
              {"factor", args_.rope_factor},
              {"original_max_position_embeddings", args_.original_seq_len},
              {"beta_fast", args_.beta_fast},
              {"beta_slow", args_.beta_slow},
              // HF scales the softmax by get_mscale(factor, mscale_all_dim)^2 (torchtitan's mscale) and
              // cos/sin by attention_factor.
              {"mscale", args_.mscale},
              {"mscale_all_dim", args_.mscale},
              {"attention_factor", args_.yarn_attention_factor}};
    }
    return {
        {"architectures", {"DeepseekV3ForCausalLM"}},
        {"model_type", "deepseek_v3"},
        {"vocab_size", args_.vocab_size},
        {"hidden_size", args_.dim},
        {"intermediate_size", args_.inter_dim},
        {"moe_intermediate_size", args_.moe_inter_dim},
        {"num_hidden_layers", args_.n_layers},
        {"num_attention_heads", args_.n_heads},
        {"num_key_value_heads", args_.n_heads},
        {"n_shared_experts", moe.num_shared_experts},
        {"n_routed_experts", moe.num_experts},
        {"num_experts_per_tok", moe.top_k},
        {"n_group", moe.num_expert_groups > 0 ? moe.num_expert_groups : 1},
        {"topk_group", moe.num_expert_groups > 0 ? moe.num_limited_groups : 1},
        {"routed_scaling_factor", moe.route_scale},
        {"norm_topk_prob", moe.route_norm},
        {"first_k_dense_replace", args_.n_dense_layers},
        {"q_lora_rank", args_.q_lora_rank > 0 ? nlohmann::json(args_.q_lora_rank) : nlohmann::json(nullptr)},
        {"kv_lora_rank", args_.kv_lora_rank},
        {"qk_nope_head_dim", args_.qk_nope_head_dim},
        {"qk_rope_head_dim", args_.qk_rope_head_dim},
        {"v_head_dim", args_.v_head_dim},
        {"max_position_embeddings", args_.max_seq_len},
        {"rms_norm_eps", args_.norm_eps},
        {"rope_interleave", rope_interleave_},
        {"rope_parameters", rope},
        {"num_nextn_predict_layers", args_.num_nextn_predict_layers},
        {"tie_word_embeddings", false},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"torch_dtype", checkpoint::hf_dtype_name(dtype)},
    };
  }

 private:
  // (HF layer index, block-relative rest) of "layers.N.rest", or of "mtp.K.block.rest" (HF's layer
  // n_layers + K); ("", "") for any other name.
  std::pair<std::string, std::string> split_block(const std::string& fqn) const {
    static const std::regex block_re(R"(layers\.(\d+)\.(.+))");
    static const std::regex mtp_block_re(R"(mtp\.(\d+)\.block\.(.+))");
    std::smatch m;
    if (std::regex_match(fqn, m, block_re)) return {m[1].str(), m[2].str()};
    if (std::regex_match(fqn, m, mtp_block_re))
      return {std::to_string(args_.n_layers + std::stoll(m[1].str())), m[2].str()};
    return {};
  }

  // The HF key of a multi-token prediction depth's own tensors (mtp.K.enorm / hnorm / eh_proj / norm); "" for
  // any other name (its block's weights are named as a block's).
  std::string mtp_own_name(const std::string& fqn) const {
    static const std::regex own_re(R"(mtp\.(\d+)\.(enorm\.weight|hnorm\.weight|eh_proj\.weight|norm\.weight))");
    std::smatch m;
    if (!std::regex_match(fqn, m, own_re)) return {};
    const std::string rest = m[2].str() == "norm.weight" ? "shared_head.norm.weight" : m[2].str();
    return fmt::format("model.layers.{}.{}", args_.n_layers + std::stoll(m[1].str()), rest);
  }

  bool is_experts(const std::string& fqn) const {
    const std::string rest = split_block(fqn).second;
    for (const auto& [titan_name, hf] : kExperts) {
      if (rest == titan_name) return true;
    }
    return false;
  }

  std::string expert_name(const std::string& fqn, int64_t e) const {
    const std::string name = hf_name(fqn);
    return std::regex_replace(name, std::regex("<e>"), std::to_string(e));
  }

  // Rows per head of a projection whose last qk_rope_head_dim rows of each head are rotated: NOPE +
  // ROPE for wq / wq_b (H heads), KVR + ROPE for wkv_a (one head); 0 for any other tensor.
  int64_t head_rows_of(const std::string& fqn) const {
    const std::string rest = split_block(fqn).second;
    if (rest == "attention.wq.weight" || rest == "attention.wq_b.weight") return args_.qk_head_dim();
    if (rest == "attention.wkv_a.weight") return args_.kv_lora_rank + args_.qk_rope_head_dim;
    return 0;
  }

  // w (heads * head_rows, in) with `permute` (titan <-> HF pair layout) applied to the rope rows.
  at::Tensor permute_rope(const at::Tensor& w, int64_t head_rows,
                          at::Tensor (*permute)(const at::Tensor&, int64_t)) const {
    const int64_t rope = args_.qk_rope_head_dim;
    const int64_t heads = w.size(0) / head_rows;
    at::Tensor per_head = w.reshape({heads, head_rows, -1}).clone();    // (heads, head_rows, in)
    at::Tensor rope_rows = per_head.narrow(1, head_rows - rope, rope);  // (heads, ROPE, in)
    rope_rows.copy_(permute(rope_rows.reshape({heads * rope, -1}), heads).view({heads, rope, -1}));
    return per_head.reshape(w.sizes());
  }

  DeepSeekV3Args args_;
  bool yarn_;
  bool rope_interleave_;
};

}  // namespace

std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const DeepSeekV3Args& args, bool yarn, bool rope_interleave) {
  return std::make_shared<DeepSeekV3HfAdapter>(args, yarn, rope_interleave);
}

std::shared_ptr<const checkpoint::HfAdapter> DeepSeekV3::hf_adapter() const {
  return deepseek_v3::hf_adapter(args_, args_.uses_yarn(seq_len()));
}

DeepSeekV3Args args_from_hf_config(const nlohmann::json& c) {
  const auto where = "[titan::deepseek_v3::args_from_hf_config]";
  DeepSeekV3Args a;
  a.dim = c.at("hidden_size").get<int64_t>();
  a.n_layers = c.at("num_hidden_layers").get<int64_t>();
  a.n_heads = c.at("num_attention_heads").get<int64_t>();
  a.vocab_size = c.at("vocab_size").get<int64_t>();
  a.inter_dim = c.at("intermediate_size").get<int64_t>();
  a.moe_inter_dim = c.at("moe_intermediate_size").get<int64_t>();
  a.n_dense_layers = std::min(c.value("first_k_dense_replace", int64_t{0}), a.n_layers);
  a.norm_eps = c.value("rms_norm_eps", 1e-6);
  a.latent_norm_eps = kHfLatentNormEps;
  a.q_lora_rank = c.contains("q_lora_rank") && c["q_lora_rank"].is_number() ? c["q_lora_rank"].get<int64_t>() : 0;
  a.kv_lora_rank = c.at("kv_lora_rank").get<int64_t>();
  a.qk_nope_head_dim = c.at("qk_nope_head_dim").get<int64_t>();
  a.qk_rope_head_dim = c.at("qk_rope_head_dim").get<int64_t>();
  a.v_head_dim = c.at("v_head_dim").get<int64_t>();
  a.max_seq_len = c.value("max_position_embeddings", a.max_seq_len);
  TITAN_CHECK_VALUE(!c.value("attention_bias", false) && c.value("hidden_act", std::string("silu")) == "silu",
                    "{} expected attention_bias false and hidden_act silu, got {} and {}.", where,
                    c.value("attention_bias", false), c.value("hidden_act", std::string("silu")));
  TITAN_CHECK_VALUE(c.value("num_key_value_heads", a.n_heads) == a.n_heads,
                    "{} expected num_key_value_heads = num_attention_heads ({}), got {}: MLA expands the latent to "
                    "every head.",
                    where, a.n_heads, c.value("num_key_value_heads", a.n_heads));
  // HF's DeepseekV3 MoE: sigmoid scores, optional top-k renormalisation, routed_scaling_factor, expert
  // outputs weighted, group-limited routing (n_group 1 = plain top-k).
  const int64_t groups = c.value("n_group", int64_t{1});
  a.moe = {.num_experts = c.at("n_routed_experts").get<int64_t>(),
           .num_shared_experts = c.value("n_shared_experts", int64_t{1}),
           .score_func = "sigmoid",
           .route_norm = c.value("norm_topk_prob", true),
           .route_scale = c.value("routed_scaling_factor", 1.0),
           .score_before_experts = false,
           .top_k = c.at("num_experts_per_tok").get<int64_t>(),
           .num_expert_groups = groups > 1 ? groups : 0,
           .num_limited_groups = groups > 1 ? c.value("topk_group", int64_t{1}) : 0};
  // transformers 5 writes rope_parameters (theta inside); 4.x rope_theta + rope_scaling.
  const nlohmann::json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"]
                              : c.contains("rope_scaling") && c["rope_scaling"].is_object()     ? c["rope_scaling"]
                                                                                            : nlohmann::json::object();
  a.rope_theta = rope.value("rope_theta", c.value("rope_theta", 10000.0));
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  TITAN_CHECK_VALUE(rope_type == "default" || rope_type == "yarn", "{} expected rope_type default or yarn, got '{}'.",
                    where, rope_type);
  a.yarn = rope_type == "yarn";
  if (*a.yarn) {
    a.original_seq_len = rope.at("original_max_position_embeddings").get<int64_t>();
    a.rope_factor = rope.contains("factor") && rope["factor"].is_number()
                        ? rope["factor"].get<double>()
                        : static_cast<double>(a.max_seq_len) / static_cast<double>(a.original_seq_len);
    const auto number_or = [&](const char* key, double fallback) {
      return rope.contains(key) && rope[key].is_number() ? rope[key].get<double>() : fallback;
    };
    a.beta_fast = number_or("beta_fast", 0.0) != 0.0 ? number_or("beta_fast", 0.0) : 32.0;
    a.beta_slow = number_or("beta_slow", 0.0) != 0.0 ? number_or("beta_slow", 0.0) : 1.0;
    const double mscale = number_or("mscale", 0.0), mscale_all_dim = number_or("mscale_all_dim", 0.0);
    // HF: softmax scale times get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim is set; cos/sin
    // times attention_factor (given, or get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    // with both set, else get_mscale(factor)).
    a.mscale = mscale_all_dim;
    a.yarn_attention_factor =
        rope.contains("attention_factor") && rope["attention_factor"].is_number()
            ? rope["attention_factor"].get<double>()
        : mscale != 0.0 && mscale_all_dim != 0.0
            ? nn::yarn_mscale(a.rope_factor, mscale) / nn::yarn_mscale(a.rope_factor, mscale_all_dim)
            : nn::yarn_mscale(a.rope_factor, 1.0);
  }
  return a;
}

}  // namespace titan::deepseek_v3
