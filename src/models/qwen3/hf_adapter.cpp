// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3/hf_adapter.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <regex>

#include "titan/core/error.hpp"
#include "titan/models/qwen3/model.hpp"

namespace titan::qwen3 {
namespace {

// titan's name inside a block -> HF's name inside model.layers.N.
constexpr std::pair<const char*, const char*> kBlock[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},     {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},     {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_norm.weight"}, {"attention.k_norm.weight", "self_attn.k_norm.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},     {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},     {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"}, {"moe.router.gate.weight", "mlp.gate.weight"},
};
// A stacked expert weight -> the per-expert HF projection.
constexpr std::pair<const char*, const char*> kExperts[] = {
    {"moe.experts.w1", "gate_proj"},
    {"moe.experts.w3", "up_proj"},
    {"moe.experts.w2", "down_proj"},
};

class Qwen3HfAdapter final : public checkpoint::HfAdapter {
 public:
  explicit Qwen3HfAdapter(Qwen3Args args) : args_(std::move(args)) {}

  std::string hf_name(const std::string& fqn) const override {
    if (std::string outer = checkpoint::hf_outer_name(fqn); !outer.empty()) return outer;
    const Block b = block_of(fqn);
    if (b.expert_proj != nullptr) return expert_name(b.layer, "*", b.expert_proj);
    return fmt::format("model.layers.{}.{}", b.layer, b.hf);
  }

  std::string hf_fallback(const std::string& fqn) const override {
    return fqn == "output.weight" ? "model.embed_tokens.weight" : "";
  }

  at::Tensor to_hf(const std::string& fqn, const at::Tensor& w) const override {
    const int64_t heads = heads_of(fqn);
    return heads == 0 ? w : checkpoint::rope_rows_to_hf(w, heads);
  }

  at::Tensor from_hf(const std::string& fqn, const at::Tensor& w) const override {
    const int64_t heads = heads_of(fqn);
    return heads == 0 ? w : checkpoint::rope_rows_from_hf(w, heads);
  }

  std::vector<std::pair<std::string, at::Tensor>> to_hf_tensors(const std::string& fqn,
                                                                const at::Tensor& whole) const override {
    const Block b = fqn.starts_with("layers.") ? block_of(fqn) : Block{};
    if (b.expert_proj == nullptr) return {{hf_name(fqn), to_hf(fqn, whole)}};
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (int64_t e = 0; e < whole.size(0); ++e) {
      out.emplace_back(expert_name(b.layer, std::to_string(e), b.expert_proj), whole[e]);  // (F, D) or (D, F)
    }
    return out;
  }

  at::Tensor read_hf(const std::string& fqn, const checkpoint::HfReader& reader) const override {
    const Block b = fqn.starts_with("layers.") ? block_of(fqn) : Block{};
    if (b.expert_proj == nullptr) return HfAdapter::read_hf(fqn, reader);
    std::vector<at::Tensor> experts;
    for (int64_t e = 0; e < args_.moe.num_experts; ++e) {
      experts.push_back(reader.read(expert_name(b.layer, std::to_string(e), b.expert_proj)));
    }
    return at::stack(experts);  // (E, F, D) or (E, D, F)
  }

  nlohmann::json hf_config(at::ScalarType dtype) const override {
    nlohmann::json c = {
        {"architectures", {args_.moe_enabled ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
        {"model_type", args_.moe_enabled ? "qwen3_moe" : "qwen3"},
        {"hidden_size", args_.dim},
        {"intermediate_size", args_.hidden_dim},
        {"num_hidden_layers", args_.n_layers},
        {"num_attention_heads", args_.n_heads},
        {"num_key_value_heads", args_.n_kv_heads},
        {"head_dim", args_.head_dim},
        {"vocab_size", args_.vocab_size},
        {"rms_norm_eps", args_.norm_eps},
        {"rope_theta", args_.rope_theta},
        {"rope_parameters", {{"rope_theta", args_.rope_theta}, {"rope_type", "default"}}},
        {"max_position_embeddings", args_.max_seq_len},
        {"tie_word_embeddings", args_.tie_word_embeddings},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"use_sliding_window", false},
        {"torch_dtype", checkpoint::hf_dtype_name(dtype)},
        {"dtype", checkpoint::hf_dtype_name(dtype)},
    };
    if (args_.moe_enabled) {
      check_hf_expressible();
      c["moe_intermediate_size"] = args_.moe_inter_dim;
      c["num_experts"] = args_.moe.num_experts;
      c["num_local_experts"] = args_.moe.num_experts;
      c["num_experts_per_tok"] = args_.moe.top_k;
      c["norm_topk_prob"] = args_.moe.route_norm;
      c["decoder_sparse_step"] = args_.decoder_sparse_step;
      c["mlp_only_layers"] = args_.mlp_only_layers;
    }
    return c;
  }

 private:
  struct Block {
    int64_t layer = -1;
    const char* hf = nullptr;           // HF name inside the block (non-expert tensors)
    const char* expert_proj = nullptr;  // gate_proj / up_proj / down_proj for a stacked expert weight
  };

  static std::string expert_name(int64_t layer, const std::string& expert, const char* proj) {
    return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, expert, proj);
  }

  static Block block_of(const std::string& fqn) {
    static const std::regex block_re(R"(layers\.(\d+)\.(.+))");
    std::smatch m;
    if (std::regex_match(fqn, m, block_re)) {
      const int64_t layer = std::stoll(m[1].str());
      for (const auto& [titan_name, hf] : kBlock) {
        if (m[2].str() == titan_name) return {.layer = layer, .hf = hf};
      }
      for (const auto& [titan_name, proj] : kExperts) {
        if (m[2].str() == titan_name) return {.layer = layer, .expert_proj = proj};
      }
    }
    TITAN_CHECK_VALUE(false, "[titan::qwen3::hf_adapter] expected a Qwen3 parameter name, got '{}'.", fqn);
    return {};
  }

  // Heads whose rows a tensor holds in RoPE layout (0: no permutation); a q/k norm weight is one head.
  int64_t heads_of(const std::string& fqn) const {
    if (fqn.ends_with("attention.wq.weight")) return args_.n_heads;
    if (fqn.ends_with("attention.wk.weight")) return args_.n_kv_heads;
    if (fqn.ends_with("attention.q_norm.weight") || fqn.ends_with("attention.k_norm.weight")) return 1;
    return 0;
  }

  void check_hf_expressible() const {
    const nn::MoEArgs& m = args_.moe;
    TITAN_CHECK_VALUE(m.num_shared_experts == 0 && m.score_func == "softmax" && !m.score_before_experts &&
                          m.route_scale == 1.0 && m.num_expert_groups == 0,
                      "[titan::qwen3::hf_adapter] expected HF Qwen3-MoE's router (no shared experts, softmax scores, "
                      "scores applied after the experts, route_scale 1, no expert groups), got num_shared_experts {}, "
                      "score_func {}, score_before_experts {}, route_scale {}, num_expert_groups {}. Export a model "
                      "with Qwen3-MoE's routing.",
                      m.num_shared_experts, m.score_func, m.score_before_experts, m.route_scale, m.num_expert_groups);
  }

  Qwen3Args args_;
};

}  // namespace

std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const Qwen3Args& args) {
  return std::make_shared<Qwen3HfAdapter>(args);
}

std::shared_ptr<const checkpoint::HfAdapter> Qwen3::hf_adapter() const { return qwen3::hf_adapter(args_); }

Qwen3Args args_from_hf_config(const nlohmann::json& c) {
  Qwen3Args a;
  a.dim = c.at("hidden_size").get<int64_t>();
  a.n_layers = c.at("num_hidden_layers").get<int64_t>();
  a.n_heads = c.at("num_attention_heads").get<int64_t>();
  a.n_kv_heads = c.value("num_key_value_heads", a.n_heads);
  a.vocab_size = c.at("vocab_size").get<int64_t>();
  a.head_dim = c.value("head_dim", a.dim / a.n_heads);
  a.hidden_dim = c.at("intermediate_size").get<int64_t>();
  a.norm_eps = c.value("rms_norm_eps", 1e-6);
  a.max_seq_len = c.value("max_position_embeddings", a.max_seq_len);
  a.tie_word_embeddings = c.value("tie_word_embeddings", false);
  // transformers 5 writes rope_parameters (theta inside); 4.x rope_theta (+ rope_scaling).
  const nlohmann::json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"]
                              : c.contains("rope_scaling") && c["rope_scaling"].is_object()     ? c["rope_scaling"]
                                                                                            : nlohmann::json::object();
  a.rope_theta = rope.value("rope_theta", c.value("rope_theta", 1000000.0));
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  TITAN_CHECK_VALUE(rope_type == "default",
                    "[titan::qwen3::args_from_hf_config] expected rope_type default, got '{}'. titan's Qwen3 has "
                    "no RoPE scaling.",
                    rope_type);
  TITAN_CHECK_VALUE(!c.value("use_sliding_window", false) && !c.value("attention_bias", false),
                    "[titan::qwen3::args_from_hf_config] expected use_sliding_window and attention_bias false, got "
                    "{} and {}. titan's Qwen3 attends to the whole window without biases.",
                    c.value("use_sliding_window", false), c.value("attention_bias", false));
  const int64_t num_experts =
      c.contains("num_experts") ? c.value("num_experts", int64_t{0}) : c.value("num_local_experts", int64_t{0});
  a.moe_enabled = c.value("model_type", std::string()) == "qwen3_moe" && num_experts > 0;
  if (a.moe_enabled) {
    a.moe_inter_dim = c.at("moe_intermediate_size").get<int64_t>();
    a.moe = {.num_experts = num_experts,
             .num_shared_experts = 0,
             .score_func = "softmax",
             .route_norm = c.value("norm_topk_prob", false),
             .route_scale = 1.0,
             .score_before_experts = false,
             .top_k = c.value("num_experts_per_tok", int64_t{8}),
             .load_balance_coeff = 0.0};
    a.decoder_sparse_step = c.value("decoder_sparse_step", int64_t{1});
    a.mlp_only_layers = c.value("mlp_only_layers", std::vector<int64_t>{});
  }
  a.validate();
  return a;
}

}  // namespace titan::qwen3
