// SPDX-License-Identifier: BSD-3-Clause
#include "titan/models/llama3/hf_adapter.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <regex>

#include "titan/core/error.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/rope.hpp"

namespace titan::llama3 {
namespace {

class Llama3HfAdapter final : public checkpoint::HfAdapter {
 public:
  explicit Llama3HfAdapter(Llama3Args args) : args_(std::move(args)) {}

  std::string hf_name(const std::string& fqn) const override {
    static const std::pair<const char*, const char*> kBlock[] = {
        {"attention.wq.weight", "self_attn.q_proj.weight"},     {"attention.wk.weight", "self_attn.k_proj.weight"},
        {"attention.wv.weight", "self_attn.v_proj.weight"},     {"attention.wo.weight", "self_attn.o_proj.weight"},
        {"feed_forward.w1.weight", "mlp.gate_proj.weight"},     {"feed_forward.w3.weight", "mlp.up_proj.weight"},
        {"feed_forward.w2.weight", "mlp.down_proj.weight"},     {"attention_norm.weight", "input_layernorm.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
    };
    if (std::string outer = checkpoint::hf_outer_name(fqn); !outer.empty()) return outer;
    static const std::regex block_re(R"(layers\.(\d+)\.(.+))");
    std::smatch m;
    if (std::regex_match(fqn, m, block_re)) {
      for (const auto& [titan_name, hf] : kBlock) {
        if (m[2].str() == titan_name) return fmt::format("model.layers.{}.{}", m[1].str(), hf);
      }
    }
    TITAN_CHECK_VALUE(false, "[titan::llama3::hf_adapter] expected a Llama 3 parameter name, got '{}'.", fqn);
    return {};
  }

  std::string hf_fallback(const std::string& fqn) const override {
    return fqn == "output.weight" ? "model.embed_tokens.weight" : "";
  }

  at::Tensor to_hf(const std::string& fqn, const at::Tensor& w) const override {
    const int64_t heads = heads_of(fqn);
    return heads == 0 ? w : checkpoint::rope_rows_to_hf(w, heads);  // (H*hd, D)
  }

  at::Tensor from_hf(const std::string& fqn, const at::Tensor& w) const override {
    const int64_t heads = heads_of(fqn);
    return heads == 0 ? w : checkpoint::rope_rows_from_hf(w, heads);  // (H*hd, D)
  }

  nlohmann::json hf_config(at::ScalarType dtype) const override {
    const nn::RopeConfig rope{};
    nlohmann::json c = {
        {"architectures", {"LlamaForCausalLM"}},
        {"model_type", "llama"},
        {"hidden_size", args_.dim},
        {"intermediate_size", args_.ffn_hidden_dim()},
        {"num_hidden_layers", args_.n_layers},
        {"num_attention_heads", args_.n_heads},
        {"num_key_value_heads", args_.kv_heads()},
        {"head_dim", args_.head_dim()},
        {"vocab_size", args_.vocab_size},
        {"rms_norm_eps", args_.norm_eps},
        {"rope_theta", args_.rope_theta},
        {"max_position_embeddings", args_.max_seq_len},
        {"tie_word_embeddings", args_.tie_word_embeddings},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"mlp_bias", false},
        {"torch_dtype", checkpoint::hf_dtype_name(dtype)},
    };
    if (args_.rope_scaling) {
      c["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", rope.scaling_factor},
                           {"low_freq_factor", rope.low_freq_factor},
                           {"high_freq_factor", rope.high_freq_factor},
                           {"original_max_position_embeddings", static_cast<int64_t>(rope.original_max_positions)}};
    }
    return c;
  }

 private:
  // Heads whose rows wq/wk hold (0: no permutation).
  int64_t heads_of(const std::string& fqn) const {
    if (fqn.ends_with("attention.wq.weight")) return args_.n_heads;
    if (fqn.ends_with("attention.wk.weight")) return args_.kv_heads();
    return 0;
  }

  Llama3Args args_;
};

}  // namespace

std::shared_ptr<const checkpoint::HfAdapter> hf_adapter(const Llama3Args& args) {
  return std::make_shared<Llama3HfAdapter>(args);
}

std::shared_ptr<const checkpoint::HfAdapter> Llama3::hf_adapter() const { return llama3::hf_adapter(args_); }

Llama3Args args_from_hf_config(const nlohmann::json& c) {
  Llama3Args a;
  a.dim = c.at("hidden_size").get<int64_t>();
  a.n_layers = c.at("num_hidden_layers").get<int64_t>();
  a.n_heads = c.at("num_attention_heads").get<int64_t>();
  a.n_kv_heads = c.value("num_key_value_heads", a.n_heads);
  a.vocab_size = c.at("vocab_size").get<int64_t>();
  a.norm_eps = c.value("rms_norm_eps", 1e-5);
  a.max_seq_len = c.value("max_position_embeddings", a.max_seq_len);
  a.tie_word_embeddings = c.value("tie_word_embeddings", false);
  // transformers 5 writes rope_parameters (theta inside); 4.x rope_theta + rope_scaling.
  const nlohmann::json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"]
                              : c.contains("rope_scaling") && c["rope_scaling"].is_object()     ? c["rope_scaling"]
                                                                                            : nlohmann::json::object();
  a.rope_theta = rope.value("rope_theta", c.value("rope_theta", 10000.0));
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  TITAN_CHECK_VALUE(rope_type == "default" || rope_type == "llama3",
                    "[titan::llama3::args_from_hf_config] expected "
                    "rope_type default or llama3, got '{}'.",
                    rope_type);
  a.rope_scaling = rope_type == "llama3";
  // HF states intermediate_size outright: titan expresses it as multiple_of 1 and a multiplier,
  // half a unit high so the int() truncation in ffn_hidden_dim lands on it.
  const int64_t hidden = c.at("intermediate_size").get<int64_t>();
  const int64_t base = 2 * (4 * a.dim) / 3;
  a.multiple_of = 1;
  a.ffn_dim_multiplier = (static_cast<double>(hidden) + 0.5) / static_cast<double>(base);
  TITAN_CHECK_VALUE(a.ffn_hidden_dim() == hidden,
                    "[titan::llama3::args_from_hf_config] expected an intermediate_size "
                    "titan can express, got {} (dim {}).",
                    hidden, a.dim);
  TITAN_CHECK_VALUE(c.value("head_dim", a.head_dim()) == a.head_dim(),
                    "[titan::llama3::args_from_hf_config] expected "
                    "head_dim = hidden_size / num_attention_heads = {}, got {}.",
                    a.head_dim(), c.value("head_dim", 0));
  return a;
}

}  // namespace titan::llama3
