// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/moe.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/layout/sharded_param.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/split_backward.hpp"

namespace titan::nn {
namespace {
constexpr double kInStd = 0.02;
// torch.nn.init.trunc_normal_'s default absolute cut-offs, kept for parity with torchtitan.
constexpr double kCutLow = -2.0;
constexpr double kCutHigh = 2.0;
// route_norm's guard against an all-zero row (torchtitan's).
constexpr double kRouteNormEps = 1e-20;

// The indices of the k largest entries along the last dim, best first; among equal values the lower
// index wins (a stable descending sort), on every device. at::topk leaves ties unspecified.
at::Tensor topk_indices(const at::Tensor& values, int64_t k) {  // (..., n) -> (..., k) int64
  return std::get<1>(at::sort(values, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(-1, 0, k);
}

// Node-limited routing: keeps the num_limited_groups groups with the largest sum of their top-2
// scores and sets every expert of the other groups to -inf.
at::Tensor limit_to_groups(const at::Tensor& scores, const MoEArgs& args) {  // (T, E) -> (T, E)
  const int64_t per_group = args.num_experts / args.num_expert_groups;
  at::Tensor grouped = scores.view({-1, args.num_expert_groups, per_group});  // (T, G, E/G)
  at::Tensor group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);         // (T, G): values, ties irrelevant
  at::Tensor kept = topk_indices(group_scores, args.num_limited_groups);      // (T, L)
  at::Tensor dropped = at::ones_like(group_scores, at::kBool).scatter_(1, kept, false);  // (T, G)
  return grouped.masked_fill(dropped.unsqueeze(-1), -std::numeric_limits<double>::infinity())
      .view({-1, args.num_experts});
}

// at::_grouped_mm's operands: every row, and every group's first row, starts at a multiple of 16 bytes.
constexpr int64_t kGroupedMmAlignBytes = 16;

int64_t aligned_elements(at::ScalarType dtype) {
  return kGroupedMmAlignBytes / static_cast<int64_t>(c10::elementSize(dtype));
}

// dim and hidden_dim as row lengths of `dtype` operands.
void check_grouped_mm_rows(at::ScalarType dtype, int64_t dim, int64_t hidden_dim) {
  const int64_t align = aligned_elements(dtype);
  TITAN_CHECK_VALUE(dim % align == 0 && hidden_dim % align == 0,
                    "[titan::nn::MoE] expected dim and hidden_dim to be multiples of {} for at::_grouped_mm ({} rows "
                    "must be 16-byte aligned), got dim {} and hidden_dim {}. Pick multiples of {} or set "
                    "use_grouped_mm = false.",
                    align, c10::toString(dtype), dim, hidden_dim, align);
}

// The activation between the up projections and w2: gate g = w1 x and up u = w3 x, both (n, F).
at::Tensor activate(const at::Tensor& g, const at::Tensor& u, const ExpertsVariant& v) {
  if (v.activation == ExpertActivation::swiglu) return at::silu(g) * u;
  // gpt-oss's: the gate clamped from above only, the up projection both ways and shifted by one.
  const at::Tensor gate = g.clamp_max(v.limit);                                    // (n, F)
  return (u.clamp(-v.limit, v.limit) + 1) * (gate * at::sigmoid(gate * v.alpha));  // (n, F)
}

// Each row's bias: bias (E, F) gathered by expert_of_row (N) -> (N, F); x itself without a bias.
at::Tensor add_bias(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& expert_of_row) {
  return bias.defined() ? x + bias.index_select(0, expert_of_row) : x;
}

// The routed experts over tokens grouped by expert; offsets (E) int32 is the end row of each group and
// expert_of_row (N) the expert of each row (read only with biases).
at::Tensor grouped_experts(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                           const at::Tensor& offsets, const ExpertsVariant& v,
                           const at::Tensor& expert_of_row) {  // x (N, D) -> (N, D)
  // Each GEMM's weight gradient may be left to a zero-bubble pipeline's weight pass (nn/split_backward.hpp).
  const auto gemm = [&](const at::Tensor& a, const at::Tensor& w) {  // (n, in), (E, out, in) -> (n, out)
    return defer_weight_grad(at::_grouped_mm(a, w.transpose(-2, -1), offsets), 1);
  };
  at::Tensor g = add_bias(gemm(x, w1), v.b1, expert_of_row);          // (N, F)
  at::Tensor u = add_bias(gemm(x, w3), v.b3, expert_of_row);          // (N, F)
  return add_bias(gemm(activate(g, u, v), w2), v.b2, expert_of_row);  // (N, D)
}

// The variant with its biases in dtype (the padded path's GEMM dtype).
ExpertsVariant variant_in(const ExpertsVariant& v, at::ScalarType dtype) {
  ExpertsVariant out = v;
  for (at::Tensor* b : {&out.b1, &out.b2, &out.b3}) {
    if (b->defined()) *b = b->to(dtype);
  }
  return out;
}

bool has_biases(const ExpertsVariant& v) { return v.b1.defined() || v.b2.defined() || v.b3.defined(); }
}  // namespace

void validate(const MoEArgs& a) {
  TITAN_CHECK_VALUE(a.num_experts >= 1, "[titan::nn::MoE] expected num_experts >= 1, got {}. Set num_experts.",
                    a.num_experts);
  TITAN_CHECK_VALUE(a.top_k >= 1 && a.top_k <= a.num_experts,
                    "[titan::nn::MoE] expected 1 <= top_k <= num_experts ({}), got top_k {}. Lower top_k or add "
                    "experts.",
                    a.num_experts, a.top_k);
  TITAN_CHECK_VALUE(a.score_func == "softmax" || a.score_func == "sigmoid",
                    "[titan::nn::MoE] expected score_func \"softmax\" or \"sigmoid\", got \"{}\". Use one of them.",
                    a.score_func);
  TITAN_CHECK_VALUE(a.load_balance_loss_weight >= 0.0,
                    "[titan::nn::MoE] expected load_balance_loss_weight >= 0, got {}. Use 0 to turn the auxiliary "
                    "loss off.",
                    a.load_balance_loss_weight);
  TITAN_CHECK_VALUE(a.num_shared_experts >= 0,
                    "[titan::nn::MoE] expected num_shared_experts >= 0, got {}. Use 0 for no shared experts.",
                    a.num_shared_experts);
  TITAN_CHECK_VALUE(a.shared_expert_dim >= 0 && (!a.shared_expert_gate || a.num_shared_experts > 0),
                    "[titan::nn::MoE] expected shared_expert_dim >= 0 and shared experts under a shared_expert_gate, "
                    "got shared_expert_dim {}, num_shared_experts {}, shared_expert_gate {}. Set num_shared_experts "
                    "1 for a gated shared expert.",
                    a.shared_expert_dim, a.num_shared_experts, a.shared_expert_gate);
  TITAN_CHECK_VALUE(a.activation == ExpertActivation::swiglu || (a.swiglu_alpha > 0.0 && a.swiglu_limit > 0.0),
                    "[titan::nn::MoE] expected clamped_swiglu's swiglu_alpha and swiglu_limit > 0, got {} and {}. Use "
                    "gpt-oss's 1.702 and 7.0.",
                    a.swiglu_alpha, a.swiglu_limit);
  TITAN_CHECK_VALUE(a.load_balance_coeff >= 0.0,
                    "[titan::nn::MoE] expected load_balance_coeff >= 0, got {}. Use 0 to turn the expert bias off.",
                    a.load_balance_coeff);
  TITAN_CHECK_VALUE(a.num_expert_groups >= 0 && a.num_limited_groups >= 0,
                    "[titan::nn::MoE] expected num_expert_groups >= 0 and num_limited_groups >= 0, got {} and {}. Use "
                    "0 for plain top-k routing.",
                    a.num_expert_groups, a.num_limited_groups);
  if (a.num_expert_groups == 0) {
    TITAN_CHECK_VALUE(a.num_limited_groups == 0,
                      "[titan::nn::MoE] expected num_limited_groups 0 without num_expert_groups, got {}. Set "
                      "num_expert_groups too, or num_limited_groups = 0.",
                      a.num_limited_groups);
    return;
  }
  TITAN_CHECK_VALUE(a.num_experts % a.num_expert_groups == 0,
                    "[titan::nn::MoE] expected num_experts divisible by num_expert_groups, got {} experts in {} "
                    "groups. Pick num_expert_groups dividing num_experts.",
                    a.num_experts, a.num_expert_groups);
  const int64_t per_group = a.num_experts / a.num_expert_groups;
  TITAN_CHECK_VALUE(per_group >= 2,
                    "[titan::nn::MoE] expected >= 2 experts per group (groups are ranked by their top-2 scores), got "
                    "{} ({} experts / {} groups). Use fewer groups.",
                    per_group, a.num_experts, a.num_expert_groups);
  TITAN_CHECK_VALUE(a.num_limited_groups >= 1 && a.num_limited_groups <= a.num_expert_groups,
                    "[titan::nn::MoE] expected 1 <= num_limited_groups <= num_expert_groups ({}), got {}. Lower "
                    "num_limited_groups.",
                    a.num_expert_groups, a.num_limited_groups);
  TITAN_CHECK_VALUE(a.top_k <= a.num_limited_groups * per_group,
                    "[titan::nn::MoE] expected top_k <= num_limited_groups * experts per group ({} * {}), got top_k "
                    "{}. Raise num_limited_groups or lower top_k.",
                    a.num_limited_groups, per_group, a.top_k);
}

// ---- router --------------------------------------------------------------------------------------

TokenChoiceTopKRouter::TokenChoiceTopKRouter(int64_t dim, const MoEArgs& args_, const at::TensorOptions& options)
    : args(args_) {
  validate(args);
  gate = register_module("gate", std::make_shared<Linear>(dim, args.num_experts, options, args.gate_bias));
}

Routing TokenChoiceTopKRouter::forward(const at::Tensor& x, const at::Tensor& expert_bias) const {
  at::Tensor logits = gate->forward(x).to(at::kFloat);  // (T, E) fp32: softmax/sigmoid in fp32, as torchtitan
  at::Tensor scores = args.score_func == "softmax" ? at::softmax(logits, /*dim=*/-1) : at::sigmoid(logits);  // (T, E)
  at::Tensor selected;  // (T, K) int64
  {
    at::NoGradGuard no_grad;  // selection is not differentiable; the bias steers it and nothing else
    at::Tensor choice = expert_bias.defined() ? scores.detach() + expert_bias : scores.detach();  // (T, E)
    if (args.num_expert_groups > 0) choice = limit_to_groups(choice, args);
    selected = topk_indices(choice, args.top_k);
  }
  at::Tensor top_scores = scores.gather(1, selected);  // (T, K): unbiased scores of the chosen experts
  if (args.route_norm) top_scores = top_scores / (top_scores.sum(-1, /*keepdim=*/true) + kRouteNormEps);
  top_scores = top_scores * args.route_scale;
  at::Tensor counts = at::bincount(selected.reshape(-1), {}, args.num_experts);  // (E) int64
  return {scores, top_scores, selected, counts};
}

void TokenChoiceTopKRouter::init_weights(const InitSite& site, double init_std) {
  trunc_normal_(gate->weight, site / "gate.weight", 0.0, init_std, kCutLow, kCutHigh);
  at::NoGradGuard no_grad;
  if (gate->bias.defined()) gate->bias.zero_();
}

// ---- experts -------------------------------------------------------------------------------------

namespace detail {

PaddedExpertGroups pad_expert_groups(const at::Tensor& tokens_per_expert, int64_t num_tokens, int64_t align) {
  TITAN_CHECK_VALUE(align >= 1, "[titan::nn::MoE] expected a group alignment >= 1 row, got {}.", align);
  TITAN_CHECK_VALUE(tokens_per_expert.dim() == 1 && num_tokens >= 0,
                    "[titan::nn::MoE] expected tokens_per_expert (E) and num_tokens >= 0, got {} dims and {} tokens.",
                    tokens_per_expert.dim(), num_tokens);
  at::NoGradGuard no_grad;
  const at::Tensor counts = tokens_per_expert.to(at::kLong);  // (E)
  const int64_t experts = counts.size(0);
  // An empty expert still gets one aligned group, all padding, as torchtitan's generate_permute_indices
  // gives it: no group the kernel sees is empty, and that expert's weight gradient is a GEMM over zeros.
  at::Tensor padded = at::floor_divide(counts.clamp_min(align) + (align - 1), align) * align;  // (E)
  at::Tensor padded_ends = at::cumsum(padded, 0);                                              // (E)
  at::Tensor shift = (padded_ends - padded) - (at::cumsum(counts, 0) - counts);  // (E): padding before each group
  // The expert of each token; output_size spares a device-to-host sync for the size of the result.
  at::Tensor expert_of_token = at::repeat_interleave(counts, std::optional<int64_t>(num_tokens));       // (N)
  at::Tensor rows = at::arange(num_tokens, counts.options()) + shift.index_select(0, expert_of_token);  // (N)
  // Every group's padded size is at most its count + align, so this bound holds without reading the counts.
  const int64_t bound = num_tokens + experts * align;
  return {.rows = rows, .offsets = padded_ends.to(at::kInt), .padded_rows = (bound + align - 1) / align * align};
}

at::Tensor pad_expert_rows(const at::Tensor& x, const PaddedExpertGroups& groups) {
  return at::zeros({groups.padded_rows, x.size(1)}, x.options()).index_copy(0, groups.rows, x);  // (P, D)
}

at::Tensor unpad_expert_rows(const at::Tensor& y, const PaddedExpertGroups& groups) {
  return y.index_select(0, groups.rows);  // (N, D)
}

at::Tensor experts_grouped_mm_padded(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                                     const at::Tensor& w3, const at::Tensor& tokens_per_expert, at::ScalarType dtype,
                                     const ExpertsVariant& variant) {
  check_grouped_mm_rows(dtype, x.size(-1), w1.size(1));
  const PaddedExpertGroups groups =
      pad_expert_groups(tokens_per_expert.to(x.device()), x.size(0), aligned_elements(dtype));
  at::Tensor padded = pad_expert_rows(x.to(dtype), groups);  // (P, D)
  at::Tensor expert_of_row;                                  // (P): rows past the last group are padding
  if (has_biases(variant)) {
    const at::Tensor rows = at::arange(groups.padded_rows, groups.offsets.options());
    expert_of_row = at::searchsorted(groups.offsets, rows, /*out_int32=*/false, /*right=*/true)
                        .clamp_max(tokens_per_expert.size(0) - 1);
  }
  at::Tensor out = grouped_experts(padded, w1.to(dtype), w2.to(dtype), w3.to(dtype), groups.offsets,
                                   variant_in(variant, dtype), expert_of_row);  // (P, D)
  return unpad_expert_rows(out, groups).to(x.scalar_type());                    // (N, D)
}

}  // namespace detail

at::Tensor experts_grouped_mm(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                              const at::Tensor& tokens_per_expert, const ExpertsVariant& variant) {
  // CUDA's grouped GEMM kernels take bf16 operands whose groups start 16-byte aligned (torchtitan's
  // _run_experts_grouped_mm under indices_padding_wrapper); the CPU one has neither requirement.
  if (x.is_cuda()) {
    return detail::experts_grouped_mm_padded(x, w1, w2, w3, tokens_per_expert, at::kBFloat16, variant);
  }
  check_grouped_mm_rows(x.scalar_type(), x.size(-1), w1.size(1));
  // The expert of each row, for the biases; output_size spares a device-to-host sync.
  const at::Tensor expert_of_row =
      has_biases(variant)
          ? at::repeat_interleave(tokens_per_expert.to(at::kLong), std::optional<int64_t>(x.size(0)))  // (N)
          : at::Tensor();
  return grouped_experts(x, w1, w2, w3, at::cumsum(tokens_per_expert, 0, at::kInt), variant, expert_of_row);
}

at::Tensor experts_loop(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                        const at::Tensor& tokens_per_expert, const ExpertsVariant& variant) {
  at::Tensor counts = tokens_per_expert.to(at::kCPU, at::kLong).contiguous();  // (E)
  std::vector<int64_t> sizes(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
  std::vector<at::Tensor> xs = x.split_with_sizes(sizes, 0);  // E x (n_e, D)
  std::vector<at::Tensor> outs;
  outs.reserve(xs.size());
  // Expert i's bias row gathered for each of its tokens as the grouped path gathers it, so the bias
  // gradient adds up the same rows in the same order (a broadcast's reduction would sum them otherwise).
  const auto biased = [](const at::Tensor& y, const at::Tensor& bias, int64_t i) {
    return bias.defined() ? y + bias.index_select(0, at::full({y.size(0)}, i, y.options().dtype(at::kLong))) : y;
  };
  for (size_t e = 0; e < xs.size(); ++e) {
    const auto i = static_cast<int64_t>(e);
    at::Tensor g = biased(at::matmul(xs[e], w1[i].t()), variant.b1, i);                     // (n_e, F)
    at::Tensor u = biased(at::matmul(xs[e], w3[i].t()), variant.b3, i);                     // (n_e, F)
    outs.push_back(biased(at::matmul(activate(g, u, variant), w2[i].t()), variant.b2, i));  // (n_e, D)
  }
  return at::cat(outs, 0);  // (N, D)
}

GroupedExperts::GroupedExperts(int64_t dim, int64_t hidden_dim, const MoEArgs& args, const at::TensorOptions& options)
    : num_experts(args.num_experts),
      use_grouped_mm(args.use_grouped_mm),
      activation(args.activation),
      swiglu_alpha(args.swiglu_alpha),
      swiglu_limit(args.swiglu_limit) {
  w1 = register_parameter("w1", at::empty({num_experts, hidden_dim, dim}, options));
  w2 = register_parameter("w2", at::empty({num_experts, dim, hidden_dim}, options));
  w3 = register_parameter("w3", at::empty({num_experts, hidden_dim, dim}, options));
  if (args.biased_experts) {
    w1_bias = register_parameter("w1_bias", at::empty({num_experts, hidden_dim}, options));
    w2_bias = register_parameter("w2_bias", at::empty({num_experts, dim}, options));
    w3_bias = register_parameter("w3_bias", at::empty({num_experts, hidden_dim}, options));
  }
}

namespace {
// Calls f with what with_param hands out for each of ps, nested, so every parameter's reduction wraps
// the whole computation as a single with_param's would.
using Reader = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
at::Tensor with_params(const std::vector<at::Tensor>& ps, const Reader& f, std::vector<at::Tensor> got = {}) {
  if (got.size() == ps.size()) return f(got);
  const at::Tensor& next = ps[got.size()];
  return parallel::with_param(next, [&](const at::Tensor& t) {
    std::vector<at::Tensor> more = got;
    more.push_back(t);
    return with_params(ps, f, std::move(more));
  });
}
}  // namespace

at::Tensor GroupedExperts::forward(const at::Tensor& x, const at::Tensor& tokens_per_expert) const {
  // Through with_param, so a data-parallel plan (FSDP over the stacked weights) and a replicated-weight
  // style apply to the experts as to any Linear.
  std::vector<at::Tensor> params{w1, w2, w3};
  if (w1_bias.defined()) params.insert(params.end(), {w1_bias, w2_bias, w3_bias});
  return with_params(params, [&](const std::vector<at::Tensor>& p) {
    ExpertsVariant variant{.activation = activation, .alpha = swiglu_alpha, .limit = swiglu_limit};
    if (p.size() == 6) {
      variant.b1 = p[3];
      variant.b2 = p[4];
      variant.b3 = p[5];
    }
    return use_grouped_mm ? experts_grouped_mm(x, p[0], p[1], p[2], tokens_per_expert, variant)
                          : experts_loop(x, p[0], p[1], p[2], tokens_per_expert, variant);
  });
}

void GroupedExperts::init_weights(const InitSite& site, double init_std) {
  // torchtitan's gpt-oss experts draw their gate/up projection (mlp1) from the block's std too.
  const bool biased = w1_bias.defined();
  trunc_normal_(w1, site / "w1", 0.0, biased ? init_std : kInStd, kCutLow, kCutHigh);
  trunc_normal_(w2, site / "w2", 0.0, init_std, kCutLow, kCutHigh);
  trunc_normal_(w3, site / "w3", 0.0, init_std, kCutLow, kCutHigh);
  if (!biased) return;
  trunc_normal_(w1_bias, site / "w1_bias", 0.0, init_std, kCutLow, kCutHigh);
  trunc_normal_(w2_bias, site / "w2_bias", 0.0, init_std, kCutLow, kCutHigh);
  trunc_normal_(w3_bias, site / "w3_bias", 0.0, init_std, kCutLow, kCutHigh);
}

std::vector<std::pair<std::string, at::Tensor*>> GroupedExperts::stacked_parameters() {
  std::vector<std::pair<std::string, at::Tensor*>> out{{"w1", &w1}, {"w2", &w2}, {"w3", &w3}};
  if (w1_bias.defined()) out.insert(out.end(), {{"w1_bias", &w1_bias}, {"w2_bias", &w2_bias}, {"w3_bias", &w3_bias}});
  return out;
}

// ---- MoE -----------------------------------------------------------------------------------------

MoE::MoE(const MoEArgs& args_, int64_t dim, int64_t hidden_dim, const at::TensorOptions& options) : args(args_) {
  validate(args);
  router = register_module("router", std::make_shared<TokenChoiceTopKRouter>(dim, args, options));
  experts = register_module("experts", std::make_shared<GroupedExperts>(dim, hidden_dim, args, options));
  if (args.num_shared_experts > 0) {
    const int64_t shared_dim =
        args.shared_expert_dim > 0 ? args.shared_expert_dim : hidden_dim * args.num_shared_experts;
    shared_experts = register_module("shared_experts", std::make_shared<FeedForward>(dim, shared_dim, options));
    if (args.shared_expert_gate)
      shared_gate = register_module("shared_gate", std::make_shared<Linear>(dim, 1, options));
  }
  const at::TensorOptions fp32 = options.dtype(at::kFloat);
  if (args.load_balance_coeff > 0.0) expert_bias = register_buffer("expert_bias", at::zeros({args.num_experts}, fp32));
  tokens_per_expert = at::zeros({args.num_experts}, fp32);
  aux_loss = at::zeros({}, fp32);
}

at::Tensor MoE::forward(const at::Tensor& x) const {
  TITAN_CHECK_VALUE(x.dim() == 3, "[titan::nn::MoE] expected x of shape (B, S, D), got {} dims. Reshape the input.",
                    x.dim());
  const int64_t dim = x.size(2);
  const int64_t k = args.top_k;
  at::Tensor flat = x.reshape({-1, dim});  // (T, D)
  const int64_t tokens = flat.size(0);
  Routing r = router->forward(flat, expert_bias);
  {
    at::NoGradGuard no_grad;
    tokens_per_expert.add_(r.tokens_per_expert.to(tokens_per_expert.scalar_type()));
  }
  // Slots (token t, choice j) = row t * K + j, sorted by expert; the stable sort keeps each expert's
  // tokens in token order, so the permutation (and every sum after it) is deterministic.
  at::Tensor order = at::argsort(r.selected_experts.reshape(-1), /*stable=*/true, /*dim=*/0);  // (T*K)
  at::Tensor routed_input = flat.index_select(0, at::floor_divide(order, k));                  // (T*K, D)
  if (args.score_before_experts) {
    at::Tensor weights = r.top_scores.reshape(-1).index_select(0, order).unsqueeze(1);  // (T*K, 1) fp32
    routed_input = (routed_input.to(at::kFloat) * weights).to(x.scalar_type());
  }
  at::Tensor routed_output = dispatch ? dispatch->run(*experts, routed_input, r.tokens_per_expert)
                                      : experts->forward(routed_input, r.tokens_per_expert);  // (T*K, D), expert order
  at::Tensor per_slot = at::zeros_like(routed_output).index_copy(0, order, routed_output).view({tokens, k, dim});
  at::Tensor out =
      args.score_before_experts  // (T, D)
          ? per_slot.sum(1)
          : at::bmm(r.top_scores.view({tokens, 1, k}), per_slot.to(at::kFloat)).squeeze(1).to(x.scalar_type());
  out = out.view(x.sizes());  // (B, S, D)
  if (shared_gate) {
    out = at::sigmoid(shared_gate->forward(x)) * shared_experts->forward(x) + out;  // (B, S, D)
  } else if (shared_experts) {
    out = shared_experts->forward(x) + out;
  }
  if (args.load_balance_loss_weight == 0.0 || !c10::GradMode::is_enabled() || !r.scores.requires_grad()) return out;
  const at::Tensor aux = sequence_balance_loss(r.scores, r.selected_experts, x.size(0), args.load_balance_loss_weight) *
                         aux_loss_scale;  // ()
  {
    at::NoGradGuard no_grad;
    aux_loss.add_(aux.detach());
  }
  return detail::inject_aux_loss(out, aux);
}

void MoE::init_weights(const InitSite& site, double init_std) {
  experts->init_weights(site / "experts", init_std);
  router->init_weights(site / "router", init_std);
  if (shared_experts) shared_experts->init_weights(site / "shared_experts", init_std);
  if (shared_gate) trunc_normal_(shared_gate->weight, site / "shared_gate.weight", 0.0, init_std, -2.0, 2.0);
  at::NoGradGuard no_grad;
  if (expert_bias.defined()) expert_bias.zero_();
  tokens_per_expert.zero_();
  aux_loss.zero_();
}

void MoE::update_expert_bias(double coeff) {
  if (!expert_bias.defined()) return;
  at::NoGradGuard no_grad;
  at::Tensor load = tokens_per_expert.to(at::kFloat);       // (E)
  at::Tensor delta = coeff * at::sign(load.mean() - load);  // (E): up for the under-loaded
  expert_bias.add_(delta - delta.mean());
  tokens_per_expert.zero_();
}

}  // namespace titan::nn
