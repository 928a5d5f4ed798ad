// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/gpt_oss/hf_adapter.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <regex>

#include "titan/core/error.hpp"
#include "titan/models/gpt_oss/model.hpp"

namespace titan::gpt_oss {
namespace {

// How a titan tensor sits in its HF tensor.
enum class Layout {
  same,          // as is
  query_rows,    // wq weight/bias: RoPE rows permuted within each of the n_heads heads
  key_rows,      // wk weight/bias: within each of the n_kv_heads heads
  transposed,    // w2 (E, D, F) is down_proj (E, F, D)
  even_columns,  // w1 (E, F, D): gate_up_proj's even columns, transposed; w1_bias: gate_up_proj_bias's even ones
  odd_columns,   // w3 and w3_bias: the odd ones
};

struct Entry {
  const char* titan;  // name inside layers.N
  const char* hf;     // name inside model.layers.N
  Layout layout;
};

constexpr Entry kBlock[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight", Layout::query_rows},
    {"attention.wq.bias", "self_attn.q_proj.bias", Layout::query_rows},
    {"attention.wk.weight", "self_attn.k_proj.weight", Layout::key_rows},
    {"attention.wk.bias", "self_attn.k_proj.bias", Layout::key_rows},
    {"attention.wv.weight", "self_attn.v_proj.weight", Layout::same},
    {"attention.wv.bias", "self_attn.v_proj.bias", Layout::same},
    {"attention.wo.weight", "self_attn.o_proj.weight", Layout::same},
    {"attention.wo.bias", "self_attn.o_proj.bias", Layout::same},
    {"attention.sinks", "self_attn.sinks", Layout::same},
    {"attention_norm.weight", "input_layernorm.weight", Layout::same},
    {"ffn_norm.weight", "post_attention_layernorm.weight", Layout::same},
    {"moe.router.gate.weight", "mlp.router.weight", Layout::same},
    {"moe.router.gate.bias", "mlp.router.bias", Layout::same},
    {"moe.experts.w1", "mlp.experts.gate_up_proj", Layout::even_columns},
    {"moe.experts.w3", "mlp.experts.gate_up_proj", Layout::odd_columns},
    {"moe.experts.w1_bias", "mlp.experts.gate_up_proj_bias", Layout::even_columns},
    {"moe.experts.w3_bias", "mlp.experts.gate_up_proj_bias", Layout::odd_columns},
    {"moe.experts.w2", "mlp.experts.down_proj", Layout::transposed},
    {"moe.experts.w2_bias", "mlp.experts.down_proj_bias", Layout::same},
};

// A stacked expert weight (E, F, D) is read by HF as x @ W: its columns are titan's rows.
bool is_weight(const at::Tensor& w) { return w.dim() == 3; }

class GptOssHfAdapter final : public checkpoint::HfAdapter {
 public:
  explicit GptOssHfAdapter(GptOssArgs args) : args_(std::move(args)) {}

  std::string hf_name(const std::string& fqn) const override {
    if (std::string outer = checkpoint::hf_outer_name(fqn); !outer.empty()) return outer;
    const Found f = find(fqn);
    return fmt::format("model.layers.{}.{}", f.layer, f.entry->hf);
  }

  // HF's gpt-oss routes without an expert bias: a trained one (titan-convert passes it) stays in titan.
  std::vector<std::pair<std::string, at::Tensor>> to_hf_tensors(const std::string& fqn,
                                                                const at::Tensor& whole) const override {
    if (fqn.ends_with(".moe.expert_bias")) return {};
    return HfAdapter::to_hf_tensors(fqn, whole);
  }

  // A gate or up piece goes out in HF's orientation; join_hf interleaves the two.
  at::Tensor to_hf(const std::string& fqn, const at::Tensor& w) const override {
    switch (layout_of(fqn)) {
      case Layout::query_rows:
        return checkpoint::rope_rows_to_hf(w, args_.n_heads);
      case Layout::key_rows:
        return checkpoint::rope_rows_to_hf(w, args_.n_kv_heads);
      case Layout::transposed:
      case Layout::even_columns:
      case Layout::odd_columns:
        return is_weight(w) ? w.transpose(1, 2) : w;
      case Layout::same:
        break;
    }
    return w;
  }

  at::Tensor from_hf(const std::string& fqn, const at::Tensor& w) const override {
    switch (layout_of(fqn)) {
      case Layout::query_rows:
        return checkpoint::rope_rows_from_hf(w, args_.n_heads);
      case Layout::key_rows:
        return checkpoint::rope_rows_from_hf(w, args_.n_kv_heads);
      case Layout::transposed:
        return w.transpose(1, 2).contiguous();
      case Layout::even_columns:
      case Layout::odd_columns: {
        const int64_t first = layout_of(fqn) == Layout::even_columns ? 0 : 1;
        const at::Tensor half = w.slice(-1, first, w.size(-1), 2);  // (E, D, F) or (E, F)
        return (half.dim() == 3 ? half.transpose(1, 2) : half).contiguous();
      }
      case Layout::same:
        break;
    }
    return w;
  }

  at::Tensor join_hf(const std::string& hf_name,
                     const std::vector<std::pair<std::string, at::Tensor>>& pieces) const override {
    at::Tensor gate, up;  // (E, D, F) or (E, F) each
    for (const auto& [fqn, piece] : pieces) {
      (layout_of(fqn) == Layout::even_columns ? gate : up) = piece;
    }
    TITAN_CHECK_VALUE(pieces.size() == 2 && gate.defined() && up.defined(),
                      "[titan::gpt_oss::hf_adapter] expected the gate and up projections for '{}', got {} pieces. "
                      "Export w1 and w3 (and their biases) together.",
                      hf_name, pieces.size());
    return at::stack({gate, up}, -1).flatten(-2);  // (E, D, 2F) or (E, 2F): gate even, up odd
  }

  nlohmann::json hf_config(at::ScalarType dtype) const override {
    check_hf_expressible();
    std::vector<std::string> layer_types;
    for (int64_t i = 0; i < args_.n_layers; ++i) {
      layer_types.push_back(GptOssArgs::is_sliding_layer(i) ? "sliding_attention" : "full_attention");
    }
    nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", args_.rope_theta}};
    if (args_.rope_factor > 1.0) {
      rope = {{"rope_type", "yarn"},
              {"rope_theta", args_.rope_theta},
              {"factor", args_.rope_factor},
              {"beta_fast", args_.beta_fast},
              {"beta_slow", args_.beta_slow},
              {"truncate", args_.rope_truncate},
              {"original_max_position_embeddings", args_.original_seq_len}};
    }
    return {
        {"architectures", {"GptOssForCausalLM"}},
        {"model_type", "gpt_oss"},
        {"hidden_size", args_.dim},
        {"intermediate_size", args_.moe_inter_dim},
        {"num_hidden_layers", args_.n_layers},
        {"num_attention_heads", args_.n_heads},
        {"num_key_value_heads", args_.n_kv_heads},
        {"head_dim", args_.head_dim},
        {"vocab_size", args_.vocab_size},
        {"rms_norm_eps", args_.norm_eps},
        {"sliding_window", args_.sliding_window},
        {"layer_types", layer_types},
        {"num_local_experts", args_.moe.num_experts},
        {"num_experts_per_tok", args_.moe.top_k},
        {"swiglu_alpha", args_.moe.swiglu_alpha},
        {"swiglu_limit", args_.moe.swiglu_limit},
        {"rope_theta", args_.rope_theta},
        {"rope_parameters", rope},
        {"max_position_embeddings", args_.max_seq_len},
        {"tie_word_embeddings", false},
        {"attention_bias", true},
        {"hidden_act", "silu"},
        {"torch_dtype", checkpoint::hf_dtype_name(dtype)},
        {"dtype", checkpoint::hf_dtype_name(dtype)},
    };
  }

 private:
  struct Found {
    int64_t layer = -1;
    const Entry* entry = nullptr;
  };

  static Found find(const std::string& fqn) {
    static const std::regex block_re(R"(layers\.(\d+)\.(.+))");
    std::smatch m;
    if (std::regex_match(fqn, m, block_re)) {
      for (const Entry& e : kBlock) {
        if (m[2].str() == e.titan) return {.layer = std::stoll(m[1].str()), .entry = &e};
      }
    }
    TITAN_CHECK_VALUE(false, "[titan::gpt_oss::hf_adapter] expected a gpt-oss parameter name, got '{}'.", fqn);
    return {};
  }

  static Layout layout_of(const std::string& fqn) {
    return fqn.starts_with("layers.") ? find(fqn).entry->layout : Layout::same;
  }

  void check_hf_expressible() const {
    const nn::MoEArgs& m = args_.moe;
    TITAN_CHECK_VALUE(m.num_shared_experts == 0 && m.score_func == "softmax" && m.route_norm &&
                          !m.score_before_experts && m.route_scale == 1.0 && m.num_expert_groups == 0 && m.gate_bias &&
                          m.biased_experts && m.activation == nn::ExpertActivation::clamped_swiglu,
                      "[titan::gpt_oss::hf_adapter] expected HF gpt-oss's MoE (no shared experts, softmax over the "
                      "top-k, outputs weighted, route_scale 1, no expert groups, biased gate and experts, clamped "
                      "SwiGLU), got num_shared_experts {}, score_func {}, route_norm {}, score_before_experts {}, "
                      "route_scale {}, num_expert_groups {}, gate_bias {}, biased_experts {}. Export a model with "
                      "gpt-oss's MoE.",
                      m.num_shared_experts, m.score_func, m.route_norm, m.score_before_experts, m.route_scale,
                      m.num_expert_groups, m.gate_bias, m.biased_experts);
  }

  GptOssArgs args_;
};

}  // namespace

std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const GptOssArgs& args) {
  return std::make_shared<GptOssHfAdapter>(args);
}

std::shared_ptr<const checkpoint::HfAdapter> GptOss::hf_adapter() const { return gpt_oss::hf_adapter(args_); }

GptOssArgs args_from_hf_config(const nlohmann::json& c) {
  GptOssArgs a;
  a.dim = c.at("hidden_size").get<int64_t>();
  a.n_layers = c.at("num_hidden_layers").get<int64_t>();
  a.n_heads = c.at("num_attention_heads").get<int64_t>();
  a.n_kv_heads = c.value("num_key_value_heads", a.n_heads);
  a.head_dim = c.value("head_dim", a.dim / a.n_heads);
  a.vocab_size = c.at("vocab_size").get<int64_t>();
  a.moe_inter_dim = c.at("intermediate_size").get<int64_t>();
  a.norm_eps = c.value("rms_norm_eps", a.norm_eps);
  a.sliding_window = c.value("sliding_window", a.sliding_window);
  a.max_seq_len = c.value("max_position_embeddings", a.max_seq_len);
  TITAN_CHECK_VALUE(c.value("attention_bias", true) && !c.value("tie_word_embeddings", false),
                    "[titan::gpt_oss::args_from_hf_config] expected attention_bias true and tie_word_embeddings "
                    "false, got {} and {}. titan's gpt-oss has biased projections and its own output layer.",
                    c.value("attention_bias", true), c.value("tie_word_embeddings", false));
  if (c.contains("layer_types") && c["layer_types"].is_array()) {
    const auto& types = c["layer_types"];
    for (size_t i = 0; i < types.size(); ++i) {
      const char* want = GptOssArgs::is_sliding_layer(static_cast<int64_t>(i)) ? "sliding_attention" : "full_attention";
      TITAN_CHECK_VALUE(types[i] == want,
                        "[titan::gpt_oss::args_from_hf_config] expected layer_types alternating sliding_attention "
                        "and full_attention from block 0, got {} at block {}. titan's gpt-oss slides in even blocks.",
                        types[i].dump(), i);
    }
  }
  // transformers 5 writes rope_parameters (theta inside); 4.x rope_theta and rope_scaling. None: HF's yarn default.
  const nlohmann::json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"]
                              : c.contains("rope_scaling") && c["rope_scaling"].is_object()     ? c["rope_scaling"]
                                                                                            : nlohmann::json::object();
  a.rope_theta = rope.value("rope_theta", c.value("rope_theta", a.rope_theta));
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string(rope.empty() ? "yarn" : "")));
  TITAN_CHECK_VALUE(rope_type == "yarn" || rope_type == "default",
                    "[titan::gpt_oss::args_from_hf_config] expected rope_type yarn or default, got '{}'. titan's "
                    "gpt-oss has YaRN or plain RoPE.",
                    rope_type);
  if (rope_type == "default") {
    a.rope_factor = 1.0;
  } else {
    a.rope_factor = rope.value("factor", a.rope_factor);
    a.beta_fast = rope.value("beta_fast", a.beta_fast);
    a.beta_slow = rope.value("beta_slow", a.beta_slow);
    a.original_seq_len = rope.value("original_max_position_embeddings", a.original_seq_len);
    a.rope_truncate = rope.value("truncate", true);  // transformers truncates unless told not to
  }
  a.moe = gpt_oss_moe(c.value("num_local_experts", c.value("num_experts", int64_t{32})));
  a.moe.top_k = c.value("num_experts_per_tok", a.moe.top_k);
  a.moe.swiglu_alpha = c.value("swiglu_alpha", a.moe.swiglu_alpha);
  a.moe.swiglu_limit = c.value("swiglu_limit", a.moe.swiglu_limit);
  a.moe.load_balance_coeff = 0.0;
  a.validate();
  return a;
}

}  // namespace titan::gpt_oss
