// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/qwen3_5/hf_adapter.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <regex>
#include <string_view>

#include "titan/core/error.hpp"
#include "titan/models/qwen3_5/model.hpp"

namespace titan::qwen3_5 {
namespace {

// How a titan tensor sits in its HF tensor.
enum class Layout {
  same,        // as is
  query_rows,  // wq: the query half of each head of q_proj, its rotated rows in RoPE order
  gate_rows,   // wg: the gate half of each head of q_proj
  key_rows,    // wk: the rotated rows of each kv head in RoPE order
  head_norm,   // q_norm / k_norm: one head's features, the rotated ones in RoPE order
  fused_q,     // a linear block's q rows of in_proj_qkv (or channels of conv1d)
  fused_k,     // its k rows
  fused_v,     // its v rows
  experts,     // stacked routed experts: one HF tensor per expert
};

struct Entry {
  const char* titan;  // name inside layers.N
  const char* hf;     // name inside model.layers.N (an expert's projection for Layout::experts)
  Layout layout;
};

constexpr Entry kFullAttention[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight", Layout::query_rows},
    {"attention.wg.weight", "self_attn.q_proj.weight", Layout::gate_rows},
    {"attention.wk.weight", "self_attn.k_proj.weight", Layout::key_rows},
    {"attention.wv.weight", "self_attn.v_proj.weight", Layout::same},
    {"attention.wo.weight", "self_attn.o_proj.weight", Layout::same},
    {"attention.q_norm.weight", "self_attn.q_norm.weight", Layout::head_norm},
    {"attention.k_norm.weight", "self_attn.k_norm.weight", Layout::head_norm},
};

constexpr Entry kLinearAttention[] = {
    {"attention.wq.weight", "linear_attn.in_proj_qkv.weight", Layout::fused_q},
    {"attention.wk.weight", "linear_attn.in_proj_qkv.weight", Layout::fused_k},
    {"attention.wv.weight", "linear_attn.in_proj_qkv.weight", Layout::fused_v},
    {"attention.conv_q.weight", "linear_attn.conv1d.weight", Layout::fused_q},
    {"attention.conv_k.weight", "linear_attn.conv1d.weight", Layout::fused_k},
    {"attention.conv_v.weight", "linear_attn.conv1d.weight", Layout::fused_v},
    {"attention.wz.weight", "linear_attn.in_proj_z.weight", Layout::same},
    {"attention.wb.weight", "linear_attn.in_proj_b.weight", Layout::same},
    {"attention.wa.weight", "linear_attn.in_proj_a.weight", Layout::same},
    {"attention.wa.bias", "linear_attn.dt_bias", Layout::same},
    {"attention.decay.weight", "linear_attn.A_log", Layout::same},
    {"attention.norm.weight", "linear_attn.norm.weight", Layout::same},
    {"attention.wo.weight", "linear_attn.out_proj.weight", Layout::same},
};

constexpr Entry kEveryBlock[] = {
    {"attention_norm.weight", "input_layernorm.weight", Layout::same},
    {"ffn_norm.weight", "post_attention_layernorm.weight", Layout::same},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", Layout::same},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", Layout::same},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", Layout::same},
    {"moe.router.gate.weight", "mlp.gate.weight", Layout::same},
    {"moe.shared_experts.w1.weight", "mlp.shared_expert.gate_proj.weight", Layout::same},
    {"moe.shared_experts.w3.weight", "mlp.shared_expert.up_proj.weight", Layout::same},
    {"moe.shared_experts.w2.weight", "mlp.shared_expert.down_proj.weight", Layout::same},
    {"moe.shared_gate.weight", "mlp.shared_expert_gate.weight", Layout::same},
    {"moe.experts.w1", "gate_proj", Layout::experts},
    {"moe.experts.w3", "up_proj", Layout::experts},
    {"moe.experts.w2", "down_proj", Layout::experts},
};

class Qwen35HfAdapter final : public checkpoint::HfAdapter {
 public:
  explicit Qwen35HfAdapter(Qwen35Args args) : args_(std::move(args)) {}

  std::string hf_name(const std::string& fqn) const override {
    if (std::string outer = checkpoint::hf_outer_name(fqn); !outer.empty()) return outer;
    const Found f = find(fqn);
    if (f.entry->layout == Layout::experts) return expert_name(f.layer, "*", f.entry->hf);
    return fmt::format("model.layers.{}.{}", f.layer, f.entry->hf);
  }

  std::string hf_fallback(const std::string& fqn) const override {
    return fqn == "output.weight" ? "model.embed_tokens.weight" : "";
  }

  // A trained expert bias (titan's aux-loss-free balancing) has no HF tensor: it stays in titan.
  std::vector<std::pair<std::string, at::Tensor>> to_hf_tensors(const std::string& fqn,
                                                                const at::Tensor& whole) const override {
    if (fqn.ends_with(".moe.expert_bias")) return {};
    const Found f = fqn.starts_with("layers.") ? find(fqn) : Found{};
    if (f.entry == nullptr || f.entry->layout != Layout::experts) return HfAdapter::to_hf_tensors(fqn, whole);
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (int64_t e = 0; e < whole.size(0); ++e) {
      out.emplace_back(expert_name(f.layer, std::to_string(e), f.entry->hf), whole[e]);  // (F, D) or (D, F)
    }
    return out;
  }

  at::Tensor read_hf(const std::string& fqn, const checkpoint::HfReader& reader) const override {
    const Found f = fqn.starts_with("layers.") ? find(fqn) : Found{};
    if (f.entry == nullptr || f.entry->layout != Layout::experts) return HfAdapter::read_hf(fqn, reader);
    std::vector<at::Tensor> experts;
    for (int64_t e = 0; e < args_.moe.num_experts; ++e) {
      experts.push_back(reader.read(expert_name(f.layer, std::to_string(e), f.entry->hf)));
    }
    return at::stack(experts);  // (E, F, D) or (E, D, F)
  }

  // The piece of its HF tensor a titan tensor is, in HF's order; join_hf assembles the pieces.
  at::Tensor to_hf(const std::string& fqn, const at::Tensor& w) const override {
    switch (layout_of(fqn)) {
      case Layout::query_rows:
        return rotated_rows(w, args_.n_heads, /*to_hf=*/true);
      case Layout::key_rows:
        return rotated_rows(w, args_.n_kv_heads, /*to_hf=*/true);
      case Layout::head_norm:
        return rotated_rows(w, 1, /*to_hf=*/true);
      default:
        return w;
    }
  }

  at::Tensor from_hf(const std::string& fqn, const at::Tensor& w) const override {
    const Layout layout = layout_of(fqn);
    switch (layout) {
      case Layout::query_rows:
      case Layout::gate_rows: {
        // q_proj (H * 2 * HD, D): per head the query rows, then the gate rows.
        const at::Tensor half = w.unflatten(0, {args_.n_heads, 2, args_.head_dim})
                                    .select(1, layout == Layout::query_rows ? 0 : 1)
                                    .flatten(0, 1);  // (H * HD, D)
        return layout == Layout::query_rows ? rotated_rows(half, args_.n_heads, /*to_hf=*/false) : half.contiguous();
      }
      case Layout::key_rows:
        return rotated_rows(w, args_.n_kv_heads, /*to_hf=*/false);
      case Layout::head_norm:
        return rotated_rows(w, 1, /*to_hf=*/false);
      case Layout::fused_q:
      case Layout::fused_k:
      case Layout::fused_v: {
        const auto [begin, rows] = fused_rows(layout);
        const at::Tensor fused = w.dim() == 3 ? w.squeeze(1) : w;  // conv1d.weight (C, 1, K) -> (C, K)
        return fused.narrow(0, begin, rows).contiguous();
      }
      default:
        return w;
    }
  }

  at::Tensor join_hf(const std::string& hf_name,
                     const std::vector<std::pair<std::string, at::Tensor>>& pieces) const override {
    at::Tensor by_layout[static_cast<int>(Layout::experts) + 1];
    for (const auto& [fqn, piece] : pieces) by_layout[static_cast<int>(layout_of(fqn))] = piece;
    const auto piece = [&](Layout l) -> const at::Tensor& {
      const at::Tensor& t = by_layout[static_cast<int>(l)];
      TITAN_CHECK_VALUE(t.defined(),
                        "[titan::qwen3_5::hf_adapter] expected every titan tensor of '{}' to be exported together, got "
                        "{} of them. Export the whole block.",
                        hf_name, pieces.size());
      return t;
    };
    if (hf_name.ends_with("q_proj.weight")) {
      const std::vector<int64_t> heads{args_.n_heads, args_.head_dim, piece(Layout::query_rows).size(-1)};
      return at::stack({piece(Layout::query_rows).reshape(heads), piece(Layout::gate_rows).reshape(heads)}, 1)
          .flatten(0, 2);  // (H * 2 * HD, D)
    }
    const at::Tensor fused =
        at::cat({piece(Layout::fused_q), piece(Layout::fused_k), piece(Layout::fused_v)});  // (2 Hk dk + Hv dv, ...)
    return hf_name.ends_with("conv1d.weight") ? fused.unsqueeze(1) : fused;                 // conv1d: (C, 1, K)
  }

  nlohmann::json hf_config(at::ScalarType dtype) const override {
    std::vector<std::string> layer_types;
    for (int64_t i = 0; i < args_.n_layers; ++i) {
      layer_types.emplace_back(args_.is_full_attention(i) ? "full_attention" : "linear_attention");
    }
    nlohmann::json c = {
        {"architectures", {args_.moe_enabled ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"}},
        {"model_type", args_.moe_enabled ? "qwen3_5_moe_text" : "qwen3_5_text"},
        {"hidden_size", args_.dim},
        {"num_hidden_layers", args_.n_layers},
        {"num_attention_heads", args_.n_heads},
        {"num_key_value_heads", args_.n_kv_heads},
        {"head_dim", args_.head_dim},
        {"vocab_size", args_.vocab_size},
        {"rms_norm_eps", args_.norm_eps},
        {"rope_parameters",
         {{"rope_type", "default"},
          {"rope_theta", args_.rope_theta},
          {"partial_rotary_factor", args_.partial_rotary_factor}}},
        {"max_position_embeddings", args_.max_seq_len},
        {"tie_word_embeddings", args_.tie_word_embeddings},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"layer_types", layer_types},
        {"linear_conv_kernel_dim", args_.linear.conv_kernel},
        {"linear_key_head_dim", args_.linear.key_head_dim},
        {"linear_value_head_dim", args_.linear.value_head_dim},
        {"linear_num_key_heads", args_.linear.n_key_heads},
        {"linear_num_value_heads", args_.linear.n_value_heads},
        {"torch_dtype", checkpoint::hf_dtype_name(dtype)},
        {"dtype", checkpoint::hf_dtype_name(dtype)},
    };
    if (!args_.moe_enabled) {
      c["intermediate_size"] = args_.hidden_dim;
      return c;
    }
    check_hf_expressible();
    c["moe_intermediate_size"] = args_.moe_inter_dim;
    c["shared_expert_intermediate_size"] = args_.moe.shared_expert_dim;
    c["num_experts"] = args_.moe.num_experts;
    c["num_experts_per_tok"] = args_.moe.top_k;
    return c;
  }

 private:
  struct Found {
    int64_t layer = -1;
    const Entry* entry = nullptr;
  };

  static std::string expert_name(int64_t layer, const std::string& expert, const char* proj) {
    return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, expert, proj);
  }

  Found find(const std::string& fqn) const {
    static const std::regex block_re(R"(layers\.(\d+)\.(.+))");
    std::smatch m;
    if (std::regex_match(fqn, m, block_re)) {
      const int64_t layer = std::stoll(m[1].str());
      const std::string name = m[2].str();
      const auto lookup = [&](const auto& table) -> const Entry* {
        for (const Entry& e : table) {
          if (name == e.titan) return &e;
        }
        return nullptr;
      };
      const Entry* e = lookup(kEveryBlock);
      if (e == nullptr && layer < args_.n_layers) {
        e = args_.is_full_attention(layer) ? lookup(kFullAttention) : lookup(kLinearAttention);
      }
      if (e != nullptr) return {.layer = layer, .entry = e};
    }
    TITAN_CHECK_VALUE(false, "[titan::qwen3_5::hf_adapter] expected a Qwen3.5 parameter name, got '{}'.", fqn);
    return {};
  }

  Layout layout_of(const std::string& fqn) const {
    return fqn.starts_with("layers.") ? find(fqn).entry->layout : Layout::same;
  }

  // (begin, rows) of a linear block's q, k or v in its fused in_proj_qkv / conv1d.
  std::pair<int64_t, int64_t> fused_rows(Layout layout) const {
    const int64_t keys = args_.linear.n_key_heads * args_.linear.key_head_dim;
    const int64_t values = args_.linear.n_value_heads * args_.linear.value_head_dim;
    if (layout == Layout::fused_q) return {0, keys};
    if (layout == Layout::fused_k) return {keys, keys};
    return {2 * keys, values};
  }

  // The rotated rows (the first rotary_dim of each of `heads` heads) between titan's pair order and HF's halves.
  at::Tensor rotated_rows(const at::Tensor& w, int64_t heads, bool to_hf) const {
    const int64_t rotary = args_.rotary_dim();
    const at::Tensor per_head = w.unflatten(0, {heads, args_.head_dim});  // (heads, HD, ...)
    const at::Tensor rotated = per_head.narrow(1, 0, rotary).flatten(0, 1);
    const at::Tensor moved =
        to_hf ? checkpoint::rope_rows_to_hf(rotated, heads) : checkpoint::rope_rows_from_hf(rotated, heads);
    return at::cat({moved.unflatten(0, {heads, rotary}), per_head.narrow(1, rotary, args_.head_dim - rotary)}, 1)
        .flatten(0, 1);  // (heads * HD, ...)
  }

  void check_hf_expressible() const {
    const nn::MoEArgs& m = args_.moe;
    TITAN_CHECK_VALUE(
        m.num_shared_experts == 1 && m.shared_expert_gate && m.score_func == "softmax" && m.route_norm &&
            !m.score_before_experts && m.route_scale == 1.0 && m.num_expert_groups == 0,
        "[titan::qwen3_5::hf_adapter] expected HF Qwen3.5-MoE's router (one gated shared expert, softmax "
        "scores renormalised over the top k, applied after the experts, route_scale 1, no expert "
        "groups), got num_shared_experts {}, shared_expert_gate {}, score_func {}, route_norm {}, "
        "score_before_experts {}, route_scale {}, num_expert_groups {}. Export a model with Qwen3.5-MoE's "
        "routing.",
        m.num_shared_experts, m.shared_expert_gate, m.score_func, m.route_norm, m.score_before_experts, m.route_scale,
        m.num_expert_groups);
  }

  Qwen35Args args_;
};

}  // namespace

std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const Qwen35Args& args) {
  return std::make_shared<Qwen35HfAdapter>(args);
}

std::shared_ptr<const checkpoint::HfAdapter> Qwen35::hf_adapter() const { return qwen3_5::hf_adapter(args_); }

Qwen35Args args_from_hf_config(const nlohmann::json& c) {
  constexpr const char* kWhere = "titan::qwen3_5::args_from_hf_config";
  const std::string model_type = c.value("model_type", std::string());
  TITAN_CHECK_VALUE(model_type == "qwen3_5_text" || model_type == "qwen3_5_moe_text",
                    "[{}] expected model_type qwen3_5_text or qwen3_5_moe_text (a Qwen3_5ForCausalLM or "
                    "Qwen3_5MoeForCausalLM folder), got '{}'. Convert the text model of a Qwen3.5 release.",
                    kWhere, model_type);
  Qwen35Args a;
  a.dim = c.at("hidden_size").get<int64_t>();
  a.n_layers = c.at("num_hidden_layers").get<int64_t>();
  a.n_heads = c.at("num_attention_heads").get<int64_t>();
  a.n_kv_heads = c.value("num_key_value_heads", a.n_heads);
  a.head_dim = c.value("head_dim", a.head_dim);
  a.vocab_size = c.at("vocab_size").get<int64_t>();
  a.norm_eps = c.value("rms_norm_eps", a.norm_eps);
  a.max_seq_len = c.value("max_position_embeddings", a.max_seq_len);
  a.tie_word_embeddings = c.value("tie_word_embeddings", false);
  const nlohmann::json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object()
                                  ? c["rope_parameters"]
                                  : nlohmann::json::object();
  a.rope_theta = rope.value("rope_theta", c.value("rope_theta", 10000.0));
  a.partial_rotary_factor = rope.value("partial_rotary_factor", c.value("partial_rotary_factor", 0.25));
  const std::string rope_type = rope.value("rope_type", std::string("default"));
  TITAN_CHECK_VALUE(rope_type == "default",
                    "[{}] expected rope_type default, got '{}'. titan's Qwen3.5 has no RoPE "
                    "scaling.",
                    kWhere, rope_type);
  TITAN_CHECK_VALUE(
      !c.value("attention_bias", false) && c.value("hidden_act", std::string("silu")) == "silu",
      "[{}] expected attention_bias false and hidden_act silu, got {} and {}. titan's Qwen3.5 has neither "
      "biases nor another activation.",
      kWhere, c.value("attention_bias", false), c.value("hidden_act", std::string("silu")));
  a.full_attention_interval = c.value("full_attention_interval", a.full_attention_interval);
  a.layer_types = c.value("layer_types", std::vector<std::string>{});
  a.linear = {.n_key_heads = c.value("linear_num_key_heads", a.linear.n_key_heads),
              .n_value_heads = c.value("linear_num_value_heads", a.linear.n_value_heads),
              .key_head_dim = c.value("linear_key_head_dim", a.linear.key_head_dim),
              .value_head_dim = c.value("linear_value_head_dim", a.linear.value_head_dim),
              .conv_kernel = c.value("linear_conv_kernel_dim", a.linear.conv_kernel)};
  a.moe_enabled = model_type == "qwen3_5_moe_text";
  if (a.moe_enabled) {
    a.moe_inter_dim = c.value("moe_intermediate_size", a.moe_inter_dim);
    a.moe = qwen3_5_moe(c.value("num_experts", a.moe.num_experts), c.value("num_experts_per_tok", a.moe.top_k),
                        c.value("shared_expert_intermediate_size", a.moe.shared_expert_dim));
    a.moe.load_balance_coeff = 0.0;  // HF routes without an expert bias
  } else {
    a.hidden_dim = c.at("intermediate_size").get<int64_t>();
  }
  a.validate();
  return a;
}

}  // namespace titan::qwen3_5
