// SPDX-License-Identifier: BSD-3-Clause
#include "tp_styles.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <algorithm>

#include "../layout/binding.hpp"
#include "titan/core/error.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/dist/functional.hpp"
#include "titan/layout/shardable.hpp"

namespace titan::parallel::detail {
namespace {

using Kind = Placement::Kind;

// Replaces param's data by its chunk along dim and records where it lies.
void shard_param(const std::string& fqn, at::Tensor& param, int64_t dim, const TpContext& ctx) {
  TITAN_CHECK_VALUE(find_binding(param) == nullptr,
                    "[titan::parallelize] expected '{}' to be sharded "
                    "once, got a second style for it (a tied or shared weight?). Give it one style.",
                    fqn);
  const int64_t n = ctx.group.size();
  const int64_t chunk = param.size(dim) / n;
  ShardedParam info;
  info.fqn = fqn;
  info.global_shape = param.sizes().vec();
  info.placements = {{ctx.axis, Placement::shard(dim)}};
  info.offset.assign(info.global_shape.size(), 0);
  info.offset[static_cast<size_t>(dim)] = ctx.group.rank() * chunk;
  {
    at::NoGradGuard no_grad;
    param.set_data(param.narrow(dim, ctx.group.rank() * chunk, chunk).clone(at::MemoryFormat::Contiguous));
  }
  info.local_shape = param.sizes().vec();
  info.local = param;
  bind_param(param, {.info = std::move(info)});
}

std::string param_name(const std::string& path, const char* name) { return path.empty() ? name : path + "." + name; }

void record(const TpContext& ctx, TensorParallelEvent::Kind kind, int64_t chunk) {
  if (ctx.trace) ctx.trace->push_back({.kind = kind, .chunk = chunk});
}

bool pipelined(const TpContext& ctx, const at::Tensor& x) {
  return ctx.async && ctx.chunks > 1 && x.dim() > 1 && x.size(0) >= ctx.chunks && x.size(0) % ctx.chunks == 0;
}

// fn(all_gather(x, dim)), computed batch chunk by batch chunk while the next chunk's gather is in
// flight (async TP); one blocking gather otherwise.
template <class F>
at::Tensor gather_then(const at::Tensor& x, int64_t dim, const TpContext& ctx, F&& fn) {
  if (!pipelined(ctx, x)) {
    at::Tensor gathered;
    {
      const ProfileScope profile("TP::all_gather");
      gathered = dist::all_gather(x, ctx.group, dim);
    }
    return fn(gathered);
  }
  const ProfileScope profile("TP::all_gather (async, with compute)");
  using Kind = TensorParallelEvent::Kind;
  const std::vector<at::Tensor> parts = x.chunk(ctx.chunks, 0);
  std::vector<dist::PendingCollective> pending;
  pending.push_back(dist::all_gather_start(parts[0], ctx.group, dim));
  record(ctx, Kind::kIssued, 0);
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i + 1 < parts.size()) {
      pending.push_back(dist::all_gather_start(parts[i + 1], ctx.group, dim));
      record(ctx, Kind::kIssued, static_cast<int64_t>(i + 1));
    }
    const at::Tensor gathered = pending[i].finish();
    record(ctx, Kind::kFinished, static_cast<int64_t>(i));
    outputs.push_back(fn(gathered));
    record(ctx, Kind::kComputed, static_cast<int64_t>(i));
  }
  return at::cat(outputs, 0);
}

// reduce_scatter(partial(x), dim), with chunk i's reduce-scatter in flight while chunk i+1's partial
// sums are computed (async TP); blocking otherwise.
template <class F>
at::Tensor reduce_scatter_of(const at::Tensor& x, int64_t dim, const TpContext& ctx, F&& partial) {
  if (!pipelined(ctx, x)) {
    const at::Tensor sum = partial(x);
    const ProfileScope profile("TP::reduce_scatter");
    return dist::reduce_scatter(sum, ctx.group, dim);
  }
  const ProfileScope profile("TP::reduce_scatter (async, with compute)");
  using Kind = TensorParallelEvent::Kind;
  std::vector<dist::PendingCollective> pending;
  int64_t chunk = 0;
  for (const at::Tensor& part : x.chunk(ctx.chunks, 0)) {
    pending.push_back(dist::reduce_scatter_start(partial(part), ctx.group, dim));
    record(ctx, Kind::kComputed, chunk);
    record(ctx, Kind::kIssued, chunk++);
  }
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < pending.size(); ++i) {
    outputs.push_back(pending[i].finish());
    record(ctx, Kind::kFinished, static_cast<int64_t>(i));
  }
  return at::cat(outputs, 0);
}

struct ColwiseHook final : ModuleHook {
  ColwiseParallel style;
  TpContext ctx;
  bool prepared;  // inside a module whose input a PrepareModuleInput replicated (prepared_by_ancestor)
  ColwiseHook(ColwiseParallel s, TpContext c, bool p) : style(s), ctx(std::move(c)), prepared(p) {}

  at::Tensor call(const at::Tensor& x, c10::function_ref<at::Tensor(const at::Tensor&)> inner) const override {
    auto compute = [&](const at::Tensor& in) {  // in: replicated, its gradient summed over tp on the way back
      at::Tensor y = inner(in);                 // (..., out/tp)
      return style.output_layout.kind == Kind::kReplicate ? dist::gather_to_replicate(y, ctx.group, -1) : y;
    };
    if (style.input_layout.kind == Kind::kShard) return gather_then(x, style.input_layout.dim, ctx, compute);
    return compute(prepared ? x : dist::copy_to_group(x, ctx.group));
  }
};

struct RowwiseHook final : ModuleHook {
  RowwiseParallel style;
  TpContext ctx;
  int64_t vocab_begin = -1;  // an Embedding's shard [vocab_begin, vocab_end); -1 for a Linear
  int64_t vocab_end = -1;
  const ShardableLayer* biased = nullptr;  // a Linear whose bias this hook adds after the sum; null: none
  RowwiseHook(RowwiseParallel s, TpContext c) : style(s), ctx(std::move(c)) {}

  at::Tensor call(const at::Tensor& x, c10::function_ref<at::Tensor(const at::Tensor&)> inner) const override {
    const at::Tensor sum = reduced(x, inner);  // (..., out), Replicate() or this rank's Shard(d)
    return biased != nullptr ? biased->add_bias(sum) : sum;
  }

 private:
  at::Tensor reduced(const at::Tensor& x, c10::function_ref<at::Tensor(const at::Tensor&)> inner) const {
    auto partial = [&](const at::Tensor& in) {  // this rank's term of the output sum
      if (vocab_begin >= 0) {
        // Tokens outside this rank's rows look up row 0 and are zeroed: the sum over ranks is the lookup.
        const at::Tensor outside = in.lt(vocab_begin).logical_or_(in.ge(vocab_end));  // (B, S) bool
        return inner((in - vocab_begin).masked_fill_(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
      }
      return inner(style.input_layout.kind == Kind::kReplicate ? dist::split_to_shard(in, ctx.group, -1) : in);
    };
    if (style.output_layout.kind == Kind::kShard) return reduce_scatter_of(x, style.output_layout.dim, ctx, partial);
    const at::Tensor sum = partial(x);
    const ProfileScope profile("TP::all_reduce");
    return dist::all_reduce(sum, ctx.group);
  }
};

struct PrepareOutputHook final : ModuleHook {
  PrepareModuleOutput style;
  TpContext ctx;
  PrepareOutputHook(PrepareModuleOutput s, TpContext c) : style(s), ctx(std::move(c)) {}

  at::Tensor call(const at::Tensor& x, c10::function_ref<at::Tensor(const at::Tensor&)> inner) const override {
    const at::Tensor y = inner(x);
    if (style.desired_output_layout.kind == Kind::kShard) {
      return dist::split_to_shard(y, ctx.group, style.desired_output_layout.dim);
    }
    return dist::gather_to_replicate(y, ctx.group, style.output_layout.dim);
  }
};

struct PrepareInputHook final : ModuleHook {
  PrepareModuleInput style;
  TpContext ctx;
  PrepareInputHook(PrepareModuleInput s, TpContext c) : style(s), ctx(std::move(c)) {}

  at::Tensor call(const at::Tensor& x, c10::function_ref<at::Tensor(const at::Tensor&)> inner) const override {
    if (style.desired_input_layout.kind == Kind::kShard) {
      return inner(dist::split_to_shard(x, ctx.group, style.desired_input_layout.dim));
    }
    if (style.input_layout.kind == Kind::kShard) return gather_then(x, style.input_layout.dim, ctx, inner);
    return inner(dist::copy_to_group(x, ctx.group));
  }
};

// Binds param whole on every tp rank with its gradient summed over tp (each rank's use saw only its share of the
// tokens): a sequence-parallel norm's weights, a rowwise bias under a sequence-sharded output.
void bind_whole_summed(const std::string& fqn, const at::Tensor& param, const TpContext& ctx) {
  TITAN_CHECK_VALUE(find_binding(param) == nullptr,
                    "[titan::parallelize] expected '{}' "
                    "to get one style, got a second.",
                    fqn);
  ShardedParam info;
  static_cast<TensorLayout&>(info) = TensorLayout::whole(param.sizes().vec());
  info.fqn = fqn;
  info.local = param;
  dist::ProcessGroup group = ctx.group;
  bind_param(param, {.info = std::move(info),
                     .transform = [group](const at::Tensor& w) { return dist::copy_to_group(w, group); }});
}

void check_layout(const std::string& path, const char* what, const Placement& layout) {
  TITAN_CHECK_VALUE(layout.kind != Kind::kPartial,
                    "[titan::parallel::ParallelPlan] expected '{}' {} Replicate() or "
                    "Shard(d), got Partial(). Partial sums only arise inside a style.",
                    path, what);
}

// The layer's weight when it has the role a style needs, else null.
at::Tensor* weight_of(torch::nn::Module& module, ShardableLayer::Role role) {
  auto* layer = dynamic_cast<ShardableLayer*>(&module);
  return layer != nullptr && layer->shardable_role() == role ? &layer->shardable_weight() : nullptr;
}

}  // namespace

void check_style(const std::string& path, const torch::nn::Module& module, const ParallelStyle& style, int64_t degree,
                 std::vector<const c10::TensorImpl*>& vocab_sharded) {
  // Only sizes are read; the interface hands out the weight non-const.
  auto& m = const_cast<torch::nn::Module&>(module);
  const at::Tensor* linear = weight_of(m, ShardableLayer::Role::kLinear);
  const at::Tensor* embedding = weight_of(m, ShardableLayer::Role::kEmbedding);
  auto divides = [&](const at::Tensor& w, int64_t dim, const char* what) {
    TITAN_CHECK_VALUE(w.size(dim) % degree == 0,
                      "[titan::parallel::ParallelPlan] expected '{}' {} ({}) divisible by the "
                      "tensor-parallel degree {}, got a remainder of {}. Change parallelism.tensor_parallel_degree or "
                      "the model's dimensions.",
                      path, what, w.size(dim), degree, w.size(dim) % degree);
  };
  const bool colwise_or_rowwise =
      std::holds_alternative<ColwiseParallel>(style) || std::holds_alternative<RowwiseParallel>(style);
  // A bias the layer does not hand to the style would be added once per rank before a rowwise sum, or left whole
  // beside a colwise layer's sharded output features.
  auto* layer = dynamic_cast<ShardableLayer*>(&m);
  TITAN_CHECK_VALUE(!colwise_or_rowwise || !module.named_parameters(/*recurse=*/false).contains("bias") ||
                        (layer != nullptr && layer->shardable_bias() != nullptr),
                    "[titan::parallel::ParallelPlan] expected '{}' (Colwise/RowwiseParallel) to hand its bias to the "
                    "style (ShardableLayer::shardable_bias and add_bias, as titan::nn::Linear does), got a {} with a "
                    "parameter 'bias' it does not declare. Implement both for the layer.",
                    path, module.name());
  if (const auto* s = std::get_if<ColwiseParallel>(&style)) {
    TITAN_CHECK_VALUE(linear != nullptr,
                      "[titan::parallel::ParallelPlan] expected '{}' (ColwiseParallel) to be a "
                      "linear ShardableLayer (e.g. titan::nn::Linear), got {}.",
                      path, module.name());
    check_layout(path, "input_layout", s->input_layout);
    check_layout(path, "output_layout", s->output_layout);
    TITAN_CHECK_VALUE(
        !s->loss_parallel || s->output_layout.kind == Kind::kShard,
        "[titan::parallel::ParallelPlan] expected '{}' with loss_parallel to keep output_layout Shard(-1), "
        "got Replicate().",
        path);
    divides(*linear, 0, "output features");
    if (layer->tied()) {
      TITAN_CHECK_VALUE(
          std::find(vocab_sharded.begin(), vocab_sharded.end(), linear->unsafeGetTensorImpl()) != vocab_sharded.end(),
          "[titan::parallel::ParallelPlan] expected the tied head '{}' (ColwiseParallel) after the "
          "embedding whose weight it reads, sharded by its vocabulary (RowwiseParallel on the "
          "embedding), got no earlier entry sharding that weight: its one tensor cannot be whole for "
          "one and split for the other. Name the embedding first (TensorParallelRole::vocab_embedding).",
          path);
    }
  } else if (const auto* r = std::get_if<RowwiseParallel>(&style)) {
    TITAN_CHECK_VALUE(linear != nullptr || embedding != nullptr,
                      "[titan::parallel::ParallelPlan] expected '{}' "
                      "(RowwiseParallel) to be a linear or embedding ShardableLayer (e.g. titan::nn::Linear, "
                      "Embedding), got {}.",
                      path, module.name());
    check_layout(path, "input_layout", r->input_layout);
    check_layout(path, "output_layout", r->output_layout);
    TITAN_CHECK_NOT_IMPLEMENTED(!layer->tied(),
                                "[titan::parallel::ParallelPlan] expected the tied head '{}' under ColwiseParallel "
                                "(the vocabulary split of the embedding it shares), got RowwiseParallel. Give it the "
                                "head role.",
                                path);
    if (linear) divides(*linear, 1, "input features");
    if (embedding) {
      divides(*embedding, 0, "vocabulary");
      vocab_sharded.push_back(embedding->unsafeGetTensorImpl());
    }
  } else if (const auto* p = std::get_if<PrepareModuleInput>(&style)) {
    check_layout(path, "input_layout", p->input_layout);
    check_layout(path, "desired_input_layout", p->desired_input_layout);
  } else if (const auto* o = std::get_if<PrepareModuleOutput>(&style)) {
    check_layout(path, "output_layout", o->output_layout);
    check_layout(path, "desired_output_layout", o->desired_output_layout);
    TITAN_CHECK_VALUE((o->output_layout.kind == Kind::kShard) != (o->desired_output_layout.kind == Kind::kShard),
                      "[titan::parallel::ParallelPlan] expected '{}' (PrepareModuleOutput) to go from Replicate() to "
                      "Shard(d) or from Shard(d) to Replicate(), got {} -> {}. Drop the style where the layouts "
                      "agree.",
                      path, o->output_layout.str(), o->desired_output_layout.str());
  }
}

bool prepared_by_ancestor(const TensorParallelPlan& plan, const std::string& path) {
  for (const auto& [ancestor, style] : plan.styles) {
    const auto* prepare = std::get_if<PrepareModuleInput>(&style);
    if (prepare == nullptr || prepare->desired_input_layout.kind == Kind::kShard || ancestor == path) continue;
    if (ancestor.empty() || path.starts_with(ancestor + ".")) return true;
  }
  return false;
}

AppliedStyle apply_style(const std::string& path, torch::nn::Module& module, const ParallelStyle& style,
                         const TpContext& ctx, bool prepared) {
  AppliedStyle applied;
  if (std::holds_alternative<ColwiseParallel>(style) || std::holds_alternative<RowwiseParallel>(style)) {
    // The layer hands the group to a float8 matmul, whose scales then span the shards as one device's would.
    auto* layer = dynamic_cast<ShardableLayer*>(&module);
    layer->tp_group = &ctx.group;
    applied.layer = {shared_owner(module, path), layer};
  }
  if (const auto* s = std::get_if<ColwiseParallel>(&style)) {
    auto* layer = dynamic_cast<ShardableLayer*>(&module);
    // A tied head computes on the vocabulary shard its embedding's style made (validated: that style came first).
    if (!layer->tied()) {
      at::Tensor& weight = layer->shardable_weight();
      shard_param(param_name(path, "weight"), weight, 0, ctx);
      applied.params.push_back(weight);
    }
    if (at::Tensor* bias = layer->shardable_bias()) {  // split with the output features it is added to
      shard_param(param_name(path, "bias"), *bias, 0, ctx);
      applied.params.push_back(*bias);
    }
    if (const ShardableLayer::Adapter adapter = layer->shardable_adapter(); adapter.a != nullptr) {
      // x A^T is whole on every rank and each rank's B rows give its output columns; A's gradient, through every
      // rank's columns, is a partial sum.
      bind_whole_summed(param_name(path, "lora_a.weight"), *adapter.a, ctx);
      shard_param(param_name(path, "lora_b.weight"), *adapter.b, 0, ctx);
      applied.params.insert(applied.params.end(), {*adapter.a, *adapter.b});
    }
    applied.hook = std::make_shared<ColwiseHook>(*s, ctx, prepared);
    applied.loss_parallel = s->loss_parallel;
  } else if (const auto* r = std::get_if<RowwiseParallel>(&style)) {
    auto hook = std::make_shared<RowwiseHook>(*r, ctx);
    if (at::Tensor* embedding = weight_of(module, ShardableLayer::Role::kEmbedding)) {
      shard_param(param_name(path, "weight"), *embedding, 0, ctx);
      applied.params.push_back(*embedding);
      hook->vocab_begin = sharded_param(*embedding)->offset[0];
      hook->vocab_end = hook->vocab_begin + embedding->size(0);
    } else {
      auto* layer = dynamic_cast<ShardableLayer*>(&module);
      at::Tensor& weight = layer->shardable_weight();
      shard_param(param_name(path, "weight"), weight, 1, ctx);
      applied.params.push_back(weight);
      if (const ShardableLayer::Adapter adapter = layer->shardable_adapter(); adapter.a != nullptr) {
        // A's columns meet this rank's input features: x A^T is a partial sum, and so is B's gradient through it.
        shard_param(param_name(path, "lora_a.weight"), *adapter.a, 1, ctx);
        bind_whole_summed(param_name(path, "lora_b.weight"), *adapter.b, ctx);
        applied.params.insert(applied.params.end(), {*adapter.a, *adapter.b});
      }
      if (at::Tensor* bias = layer->shardable_bias()) {
        // Whole, added once to the sum. Its gradient is the output gradient summed over the tokens: a replicated
        // output's gradient is whole on every rank (after Megatron's g), a sequence shard's covers this rank's tokens
        // only, so there it is summed over tp as a sequence-parallel norm's weight is.
        layer->bias_after_reduction = true;
        hook->biased = layer;
        if (r->output_layout.kind == Kind::kShard) {
          bind_whole_summed(param_name(path, "bias"), *bias, ctx);
          applied.params.push_back(*bias);
        }
      }
    }
    applied.hook = std::move(hook);
  } else if (std::holds_alternative<SequenceParallel>(style)) {
    // Each rank sees only its sequence chunk, so each weight gradient is a partial sum.
    for (auto& item : module.named_parameters(/*recurse=*/true)) {
      bind_whole_summed(param_name(path, item.key().c_str()), item.value(), ctx);
      applied.params.push_back(item.value());
    }
  } else if (const auto* p = std::get_if<PrepareModuleInput>(&style)) {
    applied.hook = std::make_shared<PrepareInputHook>(*p, ctx);
  } else if (const auto* o = std::get_if<PrepareModuleOutput>(&style)) {
    applied.hook = std::make_shared<PrepareOutputHook>(*o, ctx);
  }
  return applied;
}

}  // namespace titan::parallel::detail
