// SPDX-License-Identifier: BSD-3-Clause
// Float8Linear's autograd function. Each operand is cast as torchao's matmul_with_hp_or_float8_args
// casts it, and each GEMM gets its operands in the memory layout torchao hands to at::_scaled_mm (or,
// emulated, to at::mm), so that the same arithmetic gives the same bits (tests/float8/oracle_test.cpp).
#include "titan/float8/linear.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/float8/cast.hpp"
#include "titan/layout/module_hooks.hpp"
#include "titan/layout/sharded_param.hpp"

namespace titan::float8 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// One GEMM operand: float8 data in the layout the GEMM reads, and scales that broadcast against it.
struct Operand {
  at::Tensor data{};   // (rows, cols) float8
  at::Tensor scale{};  // () or broadcastable to (rows, cols)
  bool rowwise = false;
  at::Tensor values{};  // (rows, cols) float32 row-major, data / scale as the CPU GEMM reads it; instead of data
};

/// The operand of a CPU tensorwise GEMM made from t in one pass (float8::cast_values): the values
/// cpu_tensorwise_mm would widen from the bytes, in the row-major layout it would give them.
Operand values_of(const at::Tensor& t, const CastSpec& spec, bool transposed, const at::Tensor& scale = {}) {
  Float8Values v = cast_values(t, spec, transposed, scale);
  return {.scale = std::move(v.scale), .values = std::move(v.values)};
}

/// The operand of an emulated CPU GEMM made from t in one pass (float8::dequantized_values): what
/// to_float(data).div(scale) gives the emulation, in its layout; `view_t` hands it over as its transpose
/// (a column-major view, as the emulation's transposed operands are).
Operand dequantized_of(const at::Tensor& t, const CastSpec& spec, ValuesLayout layout, bool view_t = false) {
  Float8Values v = dequantized_values(t, spec, layout);
  return {.scale = std::move(v.scale),
          .rowwise = spec.scaling == Scaling::kRowwise,
          .values = view_t ? v.values.t() : std::move(v.values)};
}

Operand transposed(const Float8Tensor& q, bool rowwise) {
  return {.data = q.data.t(), .scale = rowwise ? q.scale.t() : q.scale, .rowwise = rowwise};
}
Operand as_is(const Float8Tensor& q, bool rowwise) { return {.data = q.data, .scale = q.scale, .rowwise = rowwise}; }

/// ATen's CPU _scaled_mm for tensorwise scales, as its emulation computes it: fp32 copies of the data
/// times the (reciprocal) scales, b made row-major first, one fp32 GEMM. ATen itself sends the same call
/// to oneDNN's fp8 matmul on CPUs with AMX-INT8, which has no fast kernel for fp8 there (its reference
/// loop: minutes per debug-model step); on every other CPU it runs this emulation. Computing it here
/// gives every CPU the same bits and the fast fp32 GEMM.
at::Tensor cpu_tensorwise_mm(const Operand& a, const Operand& b, at::ScalarType out_dtype) {
  const auto widened = [](const Operand& o) {  // (rows, cols) float32 row-major
    if (o.values.defined()) return o.values;
    return at::mul(to_float(o.data.contiguous()), o.scale.reciprocal().item<float>());
  };
  return at::matmul(widened(a), widened(b)).to(out_dtype);  // (M, N)
}

/// a @ b with float8 operands (torchao's float8_mm / addmm_float8_unwrapped). Emulated: dequantize
/// (data / scale in float32) and at::mm; else at::_scaled_mm with reciprocal scales, a row-major and b
/// column-major.
at::Tensor scaled_mm(const Operand& a, const Operand& b, at::ScalarType out_dtype, bool use_fast_accum, bool emulate) {
  // torchao's float8 GEMMs are untouched by autocast (the oracle test under CPU autocast); the at::mm /
  // at::matmul here must be too, or CPU autocast would round their fp32 operands to bf16.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const bool rowwise = a.rowwise || b.rowwise;
  const bool cpu = a.values.defined() || b.values.defined() || a.data.is_cpu();
  if (emulate || (rowwise && cpu)) {
    const auto dequantized = [](const Operand& o) {
      return o.values.defined() ? o.values : to_float(o.data).div(o.scale);
    };
    return at::mm(dequantized(a), dequantized(b)).to(out_dtype);
  }
  if (a.values.defined() || b.values.defined()) return cpu_tensorwise_mm(a, b, out_dtype);
  const at::Tensor a_data = a.data.stride(1) == 1 ? a.data : a.data.contiguous();
  const at::Tensor b_data = b.data.stride(0) == 1 ? b.data : b.data.t().contiguous().t();
  at::Tensor a_inv = a.scale.reciprocal();
  at::Tensor b_inv = b.scale.reciprocal();
  // torchao: one operand tensorwise and the other rowwise -> repeat the tensorwise scale.
  if (rowwise && !a.rowwise) a_inv = a_inv.expand({a_data.size(0), 1}).contiguous();
  if (rowwise && !b.rowwise) b_inv = b_inv.expand({1, b_data.size(1)}).contiguous();
  if (!rowwise && a_data.is_cpu()) {
    return cpu_tensorwise_mm({.data = a_data, .scale = a.scale}, {.data = b_data, .scale = b.scale}, out_dtype);
  }
  at::Tensor post;  // rowwise without fast accumulation: the tensorwise kernel, then the scales
  if (rowwise && !use_fast_accum) {
    post = a_inv * b_inv;
    a_inv = at::ones({}, a_inv.options());
    b_inv = at::ones({}, b_inv.options());
  }
  const bool via_bf16 = rowwise && (out_dtype == at::kFloat || out_dtype == at::kHalf);
  at::Tensor out = at::_scaled_mm(a_data, b_data, a_inv, b_inv, std::nullopt, std::nullopt,
                                  via_bf16 ? at::kBFloat16 : out_dtype, use_fast_accum);
  if (post.defined()) out.mul_(post);
  return via_bf16 ? out.to(out_dtype) : out;
}

/// Which casts a recipe makes (torchao's Float8LinearConfig.from_recipe_name).
struct RecipeCasts {
  CastSpec input{};   // x for the output GEMM and for grad_weight
  CastSpec weight{};  // w for the output GEMM
  CastSpec weight_for_grad_input{};
  CastSpec grad_output{};  // grad_output for grad_input and for grad_weight
  bool grad_weight_high_precision = false;
};

RecipeCasts casts_of(Recipe recipe) {
  constexpr auto e4m3 = at::kFloat8_e4m3fn;
  switch (recipe) {
    case Recipe::kTensorwise:
      return {.input = {.dtype = e4m3},
              .weight = {.dtype = e4m3},
              .weight_for_grad_input = {.dtype = e4m3},
              .grad_output = {.dtype = at::kFloat8_e5m2}};
    case Recipe::kRowwise: {
      const CastSpec rows{.dtype = e4m3, .scaling = Scaling::kRowwise, .power_of_2_scales = true};
      return {.input = rows, .weight = rows, .weight_for_grad_input = rows, .grad_output = rows};
    }
    case Recipe::kRowwiseWithGwHp: {
      const CastSpec rows{.dtype = e4m3, .scaling = Scaling::kRowwise, .power_of_2_scales = true};
      return {.input = rows,
              .weight = rows,
              .weight_for_grad_input = {.dtype = e4m3, .power_of_2_scales = true},
              .grad_output = rows,
              .grad_weight_high_precision = true};
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown float8 recipe");
}

bool is_rowwise(const CastSpec& spec) { return spec.scaling == Scaling::kRowwise; }

/// Whether two casts of one tensor give the same scale and values.
bool same_cast(const CastSpec& a, const CastSpec& b) {
  return a.dtype == b.dtype && a.scaling == b.scaling && a.power_of_2_scales == b.power_of_2_scales;
}

struct GroupRef : torch::CustomClassHolder {
  explicit GroupRef(dist::ProcessGroup g) : group(std::move(g)) {}
  dist::ProcessGroup group;
};

// The casts of one Float8Matmul: the fused kernels, or, with a group, tensorwise scales from the amax
// all-reduced (MAX) over it, so a shard gets the whole tensor's scale and bytes (torchao's float8 TP).
struct Caster {
  const dist::ProcessGroup* group = nullptr;
  bool emulate = false;

  /// Whether a GEMM over t cast under spec and another operand cast under `other` can skip the float8
  /// bytes: a CPU GEMM with both operands tensorwise, which reads float32 values anyway, with scales from
  /// the tensors alone.
  bool skips_bytes(const at::Tensor& t, const CastSpec& spec, const CastSpec& other) const {
    return t.is_cpu() && !emulate && !is_rowwise(spec) && !is_rowwise(other) && group == nullptr;
  }
  /// The same for an emulated GEMM (emulate, or rowwise scales on CPU): its operands are dequantized
  /// values, which dequantized_values makes straight from the tensors.
  bool dequantizes(const at::Tensor& t, const CastSpec& spec, const CastSpec& other) const {
    return t.is_cpu() && (emulate || is_rowwise(spec) || is_rowwise(other)) && group == nullptr;
  }

  Float8Tensor whole(const at::Tensor& t, const CastSpec& spec) const {
    at::Tensor a = tensor_amax(t).reshape({1});  // (1)
    group->all_reduce(a, dist::ReduceOp::kMax).wait();
    return cast_with_scale(t, amax_to_scale(a, spec).reshape({}), spec.dtype);
  }
  Float8Tensor operator()(const at::Tensor& t, const CastSpec& spec) const {
    return group != nullptr && !is_rowwise(spec) ? whole(t, spec) : cast(t, spec);
  }
  Float8Tensor transposed(const at::Tensor& t, const CastSpec& spec) const {
    if (group == nullptr || is_rowwise(spec)) return cast_transposed(t, spec);
    Float8Tensor q = whole(t, spec);
    return {.data = q.data.t().contiguous(), .scale = q.scale};
  }
};

Caster caster_of(AutogradContext* ctx) {
  const c10::IValue& g = ctx->saved_data["group"];
  return {.group = g.isCapsule() ? &c10::static_intrusive_pointer_cast<GroupRef>(g.toCapsule())->group : nullptr,
          .emulate = ctx->saved_data["emulate"].toBool()};
}

class Float8Matmul : public torch::autograd::Function<Float8Matmul> {
 public:
  // w8: w already in float8 (FSDP's float8 all-gather, tensorwise), or undefined tensors; not an
  // autograd input (a struct, which apply passes through as it is).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const Float8Tensor& gathered, int64_t recipe, bool emulate,
                            const dist::ProcessGroup* tp_group) {
    const at::Tensor& w8 = gathered.data;  // (N, K) float8, or undefined
    const at::Tensor& w8_scale = gathered.scale;
    ctx->save_for_backward({x, w});
    ctx->saved_data["recipe"] = recipe;
    ctx->saved_data["emulate"] = emulate;
    // Not saved_for_backward: FSDP frees and re-gathers these bytes in place between forward and backward.
    if (w8.defined()) {
      ctx->saved_data["w8"] = w8;
      ctx->saved_data["w8_scale"] = w8_scale;
    }
    if (tp_group != nullptr && tp_group->size() > 1 && static_cast<Recipe>(recipe) == Recipe::kTensorwise) {
      ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupRef>(*tp_group));
    }
    const Caster cast = caster_of(ctx);
    const RecipeCasts c = casts_of(static_cast<Recipe>(recipe));
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // (M, K)
    // output = x (M, K) @ w^T (K, N): w is cast along K for each of its N rows.
    Operand a;  // (M, K)
    if (cast.skips_bytes(x2, c.input, c.weight)) {
      a = values_of(x2, c.input, false);
      // The backward casts x and w again under the same specs: their scales are kept (a tensorwise scale
      // is a function of the tensor, which autograd's version check keeps unchanged), sparing two amax passes.
      ctx->saved_data["x_scale"] = a.scale;
    } else if (cast.dequantizes(x2, c.input, c.weight)) {
      a = dequantized_of(x2, c.input, ValuesLayout::kRows);
    } else {
      a = as_is(cast(x2, c.input), is_rowwise(c.input));
    }
    Operand b;  // (K, N)
    if (w8.defined()) {
      b = transposed({.data = w8, .scale = w8_scale}, false);
    } else if (cast.skips_bytes(w, c.weight, c.input)) {
      b = values_of(w, c.weight, /*transposed=*/true);
      ctx->saved_data["w_scale"] = b.scale;
    } else if (cast.dequantizes(w, c.weight, c.input)) {
      b = dequantized_of(w, c.weight, ValuesLayout::kRows, /*view_t=*/true);  // the (K, N) view of w's values
    } else {
      b = transposed(cast(w, c.weight), is_rowwise(c.weight));
    }
    const at::Tensor y = scaled_mm(a, b, x.scalar_type(), /*use_fast_accum=*/true, emulate);  // (M, N)
    auto shape = x.sizes().vec();
    shape.back() = w.size(0);
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];  // (..., K)
    const at::Tensor& w = saved[1];  // (N, K)
    const auto recipe = static_cast<Recipe>(ctx->saved_data["recipe"].toInt());
    const bool emulate = ctx->saved_data["emulate"].toBool();
    const auto tensor_of = [&](const char* key) {
      const c10::IValue& v = ctx->saved_data[key];
      return v.isTensor() ? v.toTensor() : at::Tensor();
    };
    const at::Tensor w8 = tensor_of("w8");  // (N, K) float8, or undefined
    const at::Tensor w8_scale = tensor_of("w8_scale");
    const Caster cast = caster_of(ctx);
    const auto cast_transposed = [&cast](const at::Tensor& t, const CastSpec& spec) {
      return cast.transposed(t, spec);
    };
    const RecipeCasts c = casts_of(recipe);
    const at::Tensor go = grads[0].reshape({-1, w.size(0)}).contiguous();  // (M, N)
    const at::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();        // (M, K)
    const auto dtype = grads[0].scalar_type();

    // grad_input (M, K) = grad_output (M, N) @ w (N, K): grad_output cast along N for each row; w along
    // N for each of its K columns (rowwise) or as a whole.
    const CastSpec& wg = c.weight_for_grad_input;
    Operand go_rows;  // (M, N)
    if (cast.skips_bytes(go, c.grad_output, wg)) {
      go_rows = values_of(go, c.grad_output, false);
    } else if (cast.dequantizes(go, c.grad_output, wg)) {
      go_rows = dequantized_of(go, c.grad_output, ValuesLayout::kRows);
    } else {
      go_rows = as_is(cast(go, c.grad_output), is_rowwise(c.grad_output));
    }
    Operand w_cols;  // (N, K)
    if (!w8.defined() && cast.dequantizes(w, wg, c.grad_output)) {
      // The layouts of the branches below: w's bytes cast per column made row-major (rowwise), w row-major
      // (emulated tensorwise), or w^T's bytes seen as (N, K) (tensorwise beside a rowwise grad_output).
      if (is_rowwise(wg)) {
        w_cols = dequantized_of(w, wg, ValuesLayout::kColumns);
      } else if (emulate) {
        w_cols = dequantized_of(w, wg, ValuesLayout::kRows);
      } else {
        w_cols = dequantized_of(w, wg, ValuesLayout::kTransposed, /*view_t=*/true);
      }
    } else if (is_rowwise(wg)) {
      // torchao's operand is (N, K) row-major with one scale per column.
      const Float8Tensor wt = cast_transposed(w, wg);  // (K, N), scales (K, 1)
      w_cols = {.data = wt.data.t().contiguous(), .scale = wt.scale.t(), .rowwise = true};
    } else if (w8.defined()) {
      // Tensorwise: the same scale and bytes as the forward's weight cast.
      w_cols = {.data = emulate ? w8 : w8.t().contiguous().t(), .scale = w8_scale, .rowwise = false};
    } else if (cast.skips_bytes(w, wg, c.grad_output)) {
      // (N, K) row-major, as cpu_tensorwise_mm widens the column-major bytes.
      w_cols = values_of(w, wg, false, same_cast(wg, c.weight) ? tensor_of("w_scale") : at::Tensor());
    } else if (emulate) {
      w_cols = as_is(cast(w, wg), false);  // (N, K) row-major, as torchao's emulated mm reads it
    } else {
      w_cols = transposed(cast_transposed(w, wg), false);  // (N, K) column-major, as _scaled_mm wants it
    }
    at::Tensor grad_x = scaled_mm(go_rows, w_cols, dtype, /*use_fast_accum=*/false, emulate).view(x.sizes());

    // grad_weight (N, K) = grad_output^T (N, M) @ x (M, K): both cast along M.
    at::Tensor grad_w;
    if (c.grad_weight_high_precision) {
      grad_w = at::mm(go.t(), x2);
    } else if (is_rowwise(c.grad_output)) {
      const Float8Tensor got = cast_transposed(go, c.grad_output);  // (N, M), scales (N, 1)
      const Float8Tensor xt = cast_transposed(x2, c.input);         // (K, M), scales (K, 1)
      // torchao's operands: grad_output^T as a column-major view, x row-major with one scale per column.
      const Operand a{.data = got.data.t().contiguous().t(), .scale = got.scale, .rowwise = true};
      const Operand b{.data = xt.data.t().contiguous(), .scale = xt.scale.t(), .rowwise = true};
      grad_w = scaled_mm(a, b, dtype, /*use_fast_accum=*/false, emulate);
    } else if (cast.dequantizes(go, c.grad_output, c.input)) {
      // torchao's operands: grad_output^T column-major and x row-major, with per-column scales (rowwise)
      // or one scale (emulated tensorwise).
      const ValuesLayout cols = is_rowwise(c.grad_output) ? ValuesLayout::kColumns : ValuesLayout::kRows;
      grad_w = scaled_mm(dequantized_of(go, c.grad_output, cols, /*view_t=*/true), dequantized_of(x2, c.input, cols),
                         dtype, false, emulate);
    } else if (cast.skips_bytes(go, c.grad_output, c.input)) {
      // torchao's operands, (N, M) and (M, K) row-major once cpu_tensorwise_mm widens them.
      const at::Tensor go_scale = go_rows.values.defined() ? go_rows.scale : at::Tensor();
      grad_w = scaled_mm(values_of(go, c.grad_output, true, go_scale),
                         values_of(x2, c.input, false, tensor_of("x_scale")), dtype, false, emulate);
    } else if (emulate) {
      const Operand a = transposed(cast(go, c.grad_output), false);  // (N, M) column-major view
      const Operand b = as_is(cast(x2, c.input), false);             // (M, K) row-major
      grad_w = scaled_mm(a, b, dtype, /*use_fast_accum=*/false, emulate);
    } else {
      const Operand a = as_is(cast_transposed(go, c.grad_output), false);  // (N, M) row-major
      const Operand b = transposed(cast_transposed(x2, c.input), false);   // (M, K) column-major
      grad_w = scaled_mm(a, b, dtype, /*use_fast_accum=*/false, emulate);
    }
    return {grad_x, grad_w, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::string_view recipe_name(Recipe recipe) {
  switch (recipe) {
    case Recipe::kTensorwise:
      return "tensorwise";
    case Recipe::kRowwise:
      return "rowwise";
    case Recipe::kRowwiseWithGwHp:
      return "rowwise_with_gw_hp";
  }
  return "?";
}

Recipe recipe_from_name(std::string_view name) {
  for (Recipe r : {Recipe::kTensorwise, Recipe::kRowwise, Recipe::kRowwiseWithGwHp}) {
    if (recipe_name(r) == name) return r;
  }
  TITAN_CHECK_VALUE(
      false, "[titan::float8] expected recipe_name tensorwise, rowwise or rowwise_with_gw_hp, got \"{}\".", name);
  return Recipe::kTensorwise;
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& w, const Float8LinearConfig& config,
                         const parallel::WeightUse& use) {
  TITAN_CHECK_VALUE(w.dim() == 2, "[titan::float8::float8_linear] expected a 2-D weight (out, in), got {} dims.",
                    w.dim());
  TITAN_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == w.size(1),
                    "[titan::float8::float8_linear] expected input (..., {}) for weight ({}, {}), got last dim {}.",
                    w.size(1), w.size(0), w.size(1), x.dim() >= 1 ? x.size(-1) : 0);
  Float8Tensor w8;  // data (N, K) float8 and scale (), when FSDP gathered w in float8
  if (const parallel::GatheredFloat8* gathered = use.float8) {
    TITAN_CHECK_VALUE(config.recipe == Recipe::kTensorwise,
                      "[titan::float8::float8_linear] expected the tensorwise recipe for a weight FSDP gathered in "
                      "float8, got {}. Set float8.enable_fsdp_float8_all_gather = false or recipe_name = tensorwise.",
                      recipe_name(config.recipe));
    w8 = {.data = gathered->data, .scale = gathered->scale};
  }
  // As torchao's Float8Linear.forward (and F.linear under autocast): the input is cast to the autocast dtype
  // before its float8 cast, so its scale comes from the bf16 values and the output is bf16; the weight is
  // cast from its own dtype. torchao reads CUDA's autocast only; here it is the autocast of x's device.
  const at::DeviceType device = x.device().type();
  const bool autocast = at::autocast::is_autocast_available(device) && at::autocast::is_autocast_enabled(device);
  const at::Tensor input = autocast ? x.to(at::autocast::get_autocast_dtype(device)) : x;  // (..., K)
  return Float8Matmul::apply(input, w, w8, static_cast<int64_t>(config.recipe), config.emulate, use.tp_group);
}

Float8Linear::Float8Linear(int64_t in_features, int64_t out_features, const at::TensorOptions& options,
                           Float8LinearConfig config_)
    : config(config_) {
  weight = register_parameter("weight", at::empty({out_features, in_features}, options));
}

at::Tensor Float8Linear::forward(const at::Tensor& x) const {
  return parallel::module_call(*this, x, [&](const at::Tensor& in) {
    return parallel::with_param(weight, [&](const at::Tensor& w, const parallel::GatheredFloat8* float8) {
      return float8_linear(in, w, config, {.float8 = float8, .tp_group = tp_group});
    });
  });
}

std::optional<std::string> float8_skip_reason(std::string_view fqn, int64_t out_features, int64_t in_features,
                                              const std::vector<std::string>& filter_fqns) {
  if (out_features % 16 != 0 || in_features % 16 != 0) {
    return fmt::format("weight ({}, {}) has a dim not divisible by 16 (float8 GEMMs need multiples of 16)",
                       out_features, in_features);
  }
  for (const std::string& f : filter_fqns) {
    if (fqn.find(f) != std::string_view::npos) return fmt::format("its name contains filter_fqns entry \"{}\"", f);
  }
  return std::nullopt;
}

bool should_convert_to_float8(std::string_view fqn, int64_t out_features, int64_t in_features,
                              const std::vector<std::string>& filter_fqns) {
  const auto reason = float8_skip_reason(fqn, out_features, in_features, filter_fqns);
  if (reason) log::info("float8: skipping {}: {}", fqn, *reason);
  return !reason;
}

}  // namespace titan::float8
