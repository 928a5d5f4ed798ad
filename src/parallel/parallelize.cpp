// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/parallelize.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/nn/module.h>

#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../layout/binding.hpp"
#include "data_parallel_state.hpp"
#include "find_module.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/attention_context.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/loss.hpp"
#include "titan/nn/saved_ops.hpp"
#include "titan/parallel/activation_checkpoint.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/parallel/tensor_parallel.hpp"
#include "tp_styles.hpp"

namespace titan::parallel::detail {
namespace {

// At most this many names per error line: enough to find the culprit, short enough to read.
constexpr size_t kMaxNames = 8;

std::string name_list(const std::vector<std::string>& names, const char* quote = "'") {
  const size_t shown = std::min(names.size(), kMaxNames);
  const std::string separator = fmt::format("{}, {}", quote, quote);
  std::string out = fmt::format(
      "{}{}{}", quote, fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), separator), quote);
  if (names.size() > shown) out += fmt::format(" and {} more", names.size() - shown);
  return out;
}

// The contract of one handle: what the first backward checks.
struct PlanContract final : Contract, std::enable_shared_from_this<PlanContract> {
  std::string model;                                             // the model's name, for errors
  std::vector<std::pair<std::string, at::Tensor>> params;        // (fqn, registered parameter)
  std::vector<std::pair<std::string, const ModuleHook*>> hooks;  // (module path, its hook)
  std::atomic<bool> queued{false};
  std::atomic<bool> passed{false};

  void on_backward() override {
    if (passed.load(std::memory_order_relaxed) || queued.exchange(true)) return;
    std::weak_ptr<PlanContract> weak = weak_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto self = weak.lock()) self->check();
    });
  }

  void check() {
    std::vector<std::string> unread, unhooked;
    for (const auto& [fqn, p] : params) {
      const Binding* binding = find_binding(p);
      if (binding != nullptr && !binding->used.value.load(std::memory_order_relaxed)) unread.push_back(fqn);
    }
    for (const auto& [path, hook] : hooks) {
      if (!hook->ran.load(std::memory_order_relaxed)) unhooked.push_back(path.empty() ? "<root>" : path);
    }
    TITAN_CHECK_VALUE(unread.empty(),
                      "[titan::parallelize] expected every parameter of {} under the plan to be read "
                      "through titan::parallel::with_param, got {} read around it in the first forward/backward, so "
                      "its sharding and gradient reduction never ran (e.g. a torch::nn::Linear reads its weight "
                      "directly). Build those layers from titan::nn layers, or read the weight as "
                      "with_param(weight, [&](const at::Tensor& w) {{ ... }}).",
                      model, name_list(unread));
    TITAN_CHECK_VALUE(unhooked.empty(),
                      "[titan::parallelize] expected every module of {} named by "
                      "plan.tensor_parallel to run its forward through titan::parallel::module_call, got {} never "
                      "did, so its style's redistribution never happened. Wrap the module's forward: "
                      "return module_call(*this, x, [&](const at::Tensor& in) {{ ... }}).",
                      model, name_list(unhooked));
    passed.store(true, std::memory_order_relaxed);
  }

  // The parameters a layer sees only a shard of (FSDP, TP) that no layer has read through with_param yet, in the
  // order the plan applied them (forward order), each as "'fqn' (4, 8) of (8, 8)".
  std::vector<std::string> unread_shards() const {
    std::vector<std::string> out;
    for (const auto& [fqn, p] : params) {
      const Binding* binding = find_binding(p);
      if (binding == nullptr || binding->used.value.load(std::memory_order_relaxed) ||
          binding->info.local_shape == binding->info.global_shape) {
        continue;
      }
      out.push_back(fmt::format("'{}' ({}) of ({})", fqn, fmt::join(p.sizes(), ", "),
                                fmt::join(binding->info.global_shape, ", ")));
    }
    return out;
  }
};

}  // namespace

struct ParallelizedState {
  std::string model;                    // the model's name, for errors
  std::unique_ptr<Pipeline> pp;         // null without a pipeline split
  std::unique_ptr<TensorParallel> tp;   // null without tp
  std::unique_ptr<ContextParallel> cp;  // null without cp
  std::unique_ptr<ExpertParallel> ep;   // null without ep
  std::vector<std::pair<const torch::nn::Module*, std::shared_ptr<const parallel::CheckpointOptions>>>
      checkpointed;                         // modules marked for activation checkpointing, with their marks
  bool per_op = false;                      // they keep their op outputs (selective per-operator AC)
  std::unique_ptr<DataParallel> dp;         // null without data parallelism; destroyed before tp
  std::unique_ptr<DataParallel> expert_dp;  // the EP experts over efsdp x dp_replicate; null without them
  std::shared_ptr<PlanContract> contract;   // null when nothing was applied
  std::vector<std::pair<at::Tensor, unsigned>> leaf_hooks;  // (parameter, hook position)

  ~ParallelizedState() {
    for (const auto& [m, mark] : checkpointed) unmark_checkpointed(m, mark.get());
    if (!contract) return;
    for (auto& [p, position] : leaf_hooks) p.remove_hook(position);
    expert_dp.reset();
    dp.reset();
    tp.reset();
    // The parameters now hold this rank's shards with nobody to gather them: any further read of
    // them is a mistake, reported where it happens.
    for (const auto& [fqn, p] : contract->params) {
      orphan_param(p, fmt::format("[titan::parallel::with_param] expected '{}' of {} to be used while the handle "
                                  "titan::parallelize() returned is alive, got a read after it was destroyed (the "
                                  "parameter holds only this rank's shard). Keep the titan::Parallelized handle alive "
                                  "as long as the model.",
                                  fqn, model));
    }
  }
};

namespace {

// The modules activation checkpointing recomputes.
std::vector<std::pair<std::string, const torch::nn::Module*>> checkpointed_modules(
    torch::nn::Module& model, const ActivationCheckpointPlan& plan) {
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules;
  for (const auto& path : plan.modules)
    modules.emplace_back(path, &find_module(model, path, "activation_checkpoint.modules"));
  return modules;
}

// How the checkpointed modules recompute: per operator, a policy naming the Linear modules whose
// matmuls are always recomputed. Under a pipeline split a rank holds only its stages, so an entry that
// matches none of them is not an error there.
CheckpointOptions checkpoint_options(torch::nn::Module& model, const ActivationCheckpointPlan& plan, bool pipelined) {
  CheckpointOptions options{.preserve_rng_state = plan.preserve_rng_state};
  TITAN_CHECK_VALUE(plan.per_op || plan.force_recompute_mm.empty(),
                    "[titan::parallelize] expected plan.activation_checkpoint.force_recompute_mm only with per_op, "
                    "got {} entries without it. Set per_op = true (activation_checkpoint.selective_ac_option = "
                    "\"op\") or leave the list empty.",
                    plan.force_recompute_mm.size());
  if (!plan.per_op) return options;
  auto policy = std::make_shared<nn::SavedOpPolicy>();
  const auto modules = model.named_modules("", /*include_self=*/false);
  for (const std::string& entry : plan.force_recompute_mm) {
    bool matched = false;
    for (const auto& item : modules) {
      if (item.key().find(entry) == std::string::npos) continue;
      TITAN_CHECK_VALUE(dynamic_cast<const nn::Linear*>(item.value().get()) != nullptr,
                        "[titan::parallelize] expected plan.activation_checkpoint.force_recompute_mm entry '{}' to "
                        "match Linear modules, got '{}', a {}. Name the Linear whose matmul to recompute (e.g. "
                        "'router.gate').",
                        entry, item.key(), item.value()->name());
      policy->force_recompute.insert(item.value().get());
      matched = true;
    }
    TITAN_CHECK_VALUE(matched || pipelined,
                      "[titan::parallelize] expected plan.activation_checkpoint.force_recompute_mm entry '{}' to "
                      "match a module path of {}, got none. Paths look like 'layers.0.feed_forward.w1'; list them "
                      "with the model's named_modules(), or drop the entry.",
                      entry, model.name());
  }
  options.per_op = std::move(policy);
  return options;
}

// The attention modules context parallelism reaches, each able to attend across the split.
std::vector<nn::ContextParallelCapable*> context_parallel_attentions(torch::nn::Module& model,
                                                                     const ContextParallelPlan& plan,
                                                                     const dist::Mesh& mesh) {
  TITAN_CHECK_VALUE(mesh.size("cp") == 1 || !plan.attention_modules.empty(),
                    "[titan::parallelize] expected plan.context_parallel.attention_modules to name the model's "
                    "attention modules on a mesh with cp = {}, got none: {} has no CP-capable attention declared. "
                    "Name its attention modules (they must derive from nn::ContextParallelCapable and compute through "
                    "nn::causal_attention), or build the mesh with cp = 1.",
                    mesh.size("cp"), model.name());
  std::vector<nn::ContextParallelCapable*> attentions;
  for (const auto& path : plan.attention_modules) {
    torch::nn::Module& m = find_module(model, path, "context_parallel.attention_modules");
    auto* capable = dynamic_cast<nn::ContextParallelCapable*>(&m);
    TITAN_CHECK_VALUE(capable != nullptr,
                      "[titan::parallelize] expected plan.context_parallel path '{}' to be a CP-capable attention "
                      "(an nn::ContextParallelCapable computing through nn::causal_attention), got a {}. Use "
                      "titan::nn::Attention, or derive the module from nn::ContextParallelCapable.",
                      path, m.name());
    attentions.push_back(capable);
  }
  return attentions;
}

// Under pipeline parallelism a rank holds only its stages' modules: the TP styles and FSDP units of
// the other stages' modules do not apply to it.
bool held(const torch::nn::Module& model, const std::string& path) {
  if (path.empty()) return true;
  return model.named_modules("", /*include_self=*/false).contains(path);
}

ParallelPlan local_part(const torch::nn::Module& model, const ParallelPlan& plan) {
  if (plan.pipeline.stages.empty()) return plan;
  std::set<std::string> elsewhere;  // modules of stages this rank does not hold
  for (const auto& stage : plan.pipeline.stages) {
    for (const auto& path : stage) {
      if (!held(model, path)) elsewhere.insert(path);
    }
  }
  auto other_stage = [&](const std::string& path) {
    for (const auto& m : elsewhere) {
      if (path == m || path.starts_with(m + ".")) return true;
    }
    return false;
  };
  ParallelPlan local = plan;
  std::erase_if(local.tensor_parallel.styles, [&](const auto& entry) { return other_stage(entry.first); });
  std::erase_if(local.context_parallel.attention_modules, other_stage);
  std::erase_if(local.expert_parallel.moe_modules, other_stage);
  std::erase_if(local.activation_checkpoint.modules, other_stage);
  std::erase_if(local.data_parallel.options.float8_all_gather, other_stage);  // weights FQNs, under their modules
  std::erase_if(local.data_parallel.units, [&](const std::vector<std::string>& unit) {
    size_t away = 0;
    for (const auto& path : unit) away += other_stage(path) ? 1 : 0;
    TITAN_CHECK_VALUE(away == 0 || away == unit.size(),
                      "[titan::parallelize] expected each plan.data_parallel unit inside one pipeline stage, got "
                      "unit {} split across stages. Split the unit at the stage boundary.",
                      fmt::join(unit, "+"));
    return away > 0;
  });
  return local;
}

void check_tensor_parallel(const torch::nn::Module& model, const ParallelPlan& plan, const dist::Mesh& mesh) {
  const int64_t tp = mesh.size("tp");
  TITAN_CHECK_VALUE(
      tp == 1 || !plan.tensor_parallel.styles.empty(),
      "[titan::parallelize] expected "
      "plan.tensor_parallel to name modules on a mesh with tp = {}, got an empty plan: every tp rank "
      "would compute the same thing. Give the model a tensor-parallel plan or build the mesh with tp = 1.",
      tp);
  validate_tensor_parallel(model, plan.tensor_parallel, tp);
}

void check_fresh(const torch::nn::Module& model) {
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    TITAN_CHECK_VALUE(find_binding(item.value()) == nullptr,
                      "[titan::parallelize] expected a model not parallelized "
                      "yet, got '{}' already bound by an earlier parallelize(). Call parallelize() once per model "
                      "(build a fresh model to parallelize it differently).",
                      item.key());
  }
}

}  // namespace
}  // namespace titan::parallel::detail

namespace titan {

using parallel::detail::ParallelizedState;

Parallelized::Parallelized() = default;
Parallelized::Parallelized(std::unique_ptr<ParallelizedState> state) : state_(std::move(state)) {}
Parallelized::~Parallelized() = default;
Parallelized::Parallelized(Parallelized&&) noexcept = default;
Parallelized& Parallelized::operator=(Parallelized&&) noexcept = default;

std::string Parallelized::describe() const {
  std::vector<std::string> parts;
  if (pipeline()) parts.push_back(pipeline()->describe());
  if (tensor_parallel()) parts.push_back(tensor_parallel()->describe());
  if (context_parallel()) parts.push_back(context_parallel()->describe());
  if (expert_parallel()) parts.push_back(expert_parallel()->describe());
  if (state_ && !state_->checkpointed.empty()) {
    parts.push_back(fmt::format("AC({} modules{})", state_->checkpointed.size(), state_->per_op ? ", per op" : ""));
  }
  if (data_parallel()) parts.push_back(data_parallel()->describe());
  if (state_ && state_->expert_dp) parts.push_back("experts " + state_->expert_dp->describe());
  return parts.empty() ? "one device" : fmt::format("{}", fmt::join(parts, " + "));
}

parallel::Pipeline* Parallelized::pipeline() const { return state_ ? state_->pp.get() : nullptr; }
parallel::TensorParallel* Parallelized::tensor_parallel() const { return state_ ? state_->tp.get() : nullptr; }
parallel::DataParallel* Parallelized::data_parallel() const { return state_ ? state_->dp.get() : nullptr; }
parallel::DataParallel* Parallelized::expert_data_parallel() const {
  return state_ ? state_->expert_dp.get() : nullptr;
}
parallel::ContextParallel* Parallelized::context_parallel() const { return state_ ? state_->cp.get() : nullptr; }
parallel::ExpertParallel* Parallelized::expert_parallel() const { return state_ ? state_->ep.get() : nullptr; }

parallel::LocalBatch Parallelized::local_batch(const parallel::SequenceBatch& batch) const {
  return context_parallel() ? context_parallel()->shard(batch) : parallel::whole_batch(batch);
}
bool Parallelized::loss_parallel() const { return tensor_parallel() && tensor_parallel()->loss_parallel(); }

at::Tensor Parallelized::cross_entropy_sum(const at::Tensor& logits, const at::Tensor& labels) const {
  return tensor_parallel() ? tensor_parallel()->cross_entropy_sum(logits, labels)
                           : titan::cross_entropy_sum(logits, labels);
}

void Parallelized::check_contracts() const {
  if (state_ && state_->contract) state_->contract->check();
}

at::Tensor Parallelized::run_forward(const std::function<at::Tensor()>& forward) const {
  try {
    return forward();
  } catch (const c10::Error& e) {
    // Once the contract passed, every parameter was read through with_param: the error is the model's own.
    const auto* contract = state_ ? state_->contract.get() : nullptr;
    if (contract == nullptr || contract->passed.load(std::memory_order_relaxed)) throw;
    const std::vector<std::string> unread = contract->unread_shards();
    TITAN_CHECK_VALUE(unread.empty(),
                      "[titan::parallelize] expected every parameter of {} under the plan to be read through "
                      "titan::parallel::with_param, got the first forward failing inside ATen before {} {} read so: "
                      "under the plan a parameter holds only this rank's shard, so a layer that reads it directly "
                      "computes on the shard (the failing layer reads the first of them, most likely). Build those "
                      "layers from titan::nn layers, or read the weight as "
                      "with_param(weight, [&](const at::Tensor& w) {{ ... }}). ATen's error: {}",
                      contract->model, parallel::detail::name_list(unread, ""), unread.size() == 1 ? "was" : "were",
                      e.what_without_backtrace());
    throw;  // every sharded parameter was read through with_param: the error is the model's own
  }
}

Parallelized parallelize(torch::nn::Module& model, const dist::Mesh& mesh, const parallel::ParallelPlan& full_plan) {
  namespace d = parallel::detail;
  // Everything is checked before anything changes.
  d::check_fresh(model);
  d::validate_pipeline(model, full_plan.pipeline, mesh);
  const parallel::ParallelPlan plan = d::local_part(model, full_plan);
  d::check_tensor_parallel(model, plan, mesh);
  const auto attentions = d::context_parallel_attentions(model, plan.context_parallel, mesh);
  const auto checkpointed = d::checkpointed_modules(model, plan.activation_checkpoint);
  const parallel::CheckpointOptions checkpoint_options =
      d::checkpoint_options(model, plan.activation_checkpoint, !plan.pipeline.stages.empty());
  d::validate_data_parallel(model, plan.data_parallel.units, plan.data_parallel.options);
  // The cp ranks of a batch hold different tokens: their gradients are summed like data parallel ones.
  const bool data_parallel = mesh.size("dp_shard_cp") > 1 || mesh.size("dp_replicate") > 1;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    TITAN_CHECK_VALUE(!data_parallel || item.value().dim() >= 1,
                      "[titan::parallelize] expected parameters with at "
                      "least one dim under data parallelism, got a scalar '{}'. Make it shape (1).",
                      item.key());
  }

  auto state = std::make_unique<ParallelizedState>();
  state->model = model.name();
  if (!plan.pipeline.stages.empty()) state->pp = d::apply_pipeline(model, plan.pipeline, mesh);
  if (mesh.size("tp") > 1) state->tp = d::apply_tensor_parallel(model, mesh, plan.tensor_parallel);
  if (mesh.size("cp") > 1) {
    state->cp = std::make_unique<parallel::ContextParallel>(mesh, plan.context_parallel);
    for (auto* attention : attentions) attention->set_context_parallel_degree(mesh.size("cp"));
  }
  parallel::DataParallelOptions data_parallel_options = plan.data_parallel.options;
  if (mesh.size("ep") > 1 || mesh.size("etp") > 1) {
    TITAN_CHECK_VALUE(!plan.expert_parallel.moe_modules.empty() || !plan.pipeline.stages.empty(),
                      "[titan::parallelize] expected plan.expert_parallel to name the MoE layers of {} on a mesh "
                      "with ep = {} and etp = {}, got none. Name them (parallel::moe_modules(model)), or build the "
                      "mesh with ep = etp = 1 (parallelism.expert_parallel_degree and "
                      "expert_tensor_parallel_degree 1).",
                      state->model, mesh.size("ep"), mesh.size("etp"));
    state->ep =
        std::make_unique<parallel::ExpertParallel>(parallel::apply_expert_parallel(model, mesh, plan.expert_parallel));
    // The sharded experts are left out of the dense units: they have FSDP units of their own over efsdp.
    for (const at::Tensor& p : state->ep->expert_parameters()) {
      if (const auto* binding = d::find_binding(p)) data_parallel_options.ignored_params.push_back(binding->info.fqn);
    }
  }
  for (const auto& [path, m] : checkpointed) {
    state->checkpointed.emplace_back(m, parallel::detail::mark_checkpointed(*m, path, checkpoint_options));
  }
  state->per_op = checkpoint_options.per_op != nullptr;
  if (data_parallel) {
    state->dp = d::apply_data_parallel(model, plan.data_parallel.units, mesh, data_parallel_options);
  }
  if (state->ep && (mesh.size("efsdp") > 1 || mesh.size("dp_replicate") > 1)) {
    // torchtitan's efsdp: the ranks holding the same experts split them again on dim 0, gather them per
    // layer for the grouped GEMM and reduce-scatter their gradients, so each holds 1/(ep x efsdp) of them.
    std::vector<std::string> experts;
    for (const std::string& path : plan.expert_parallel.moe_modules) experts.push_back(path + ".experts");
    parallel::DataParallelOptions options = plan.data_parallel.options;
    options.float8_all_gather.clear();  // float8 converts Linears; grouped experts stay high precision
    options.float8_precompute_scales = false;
    options.ignored_params.clear();
    state->expert_dp = d::apply_expert_data_parallel(model, experts, mesh, options);
    parallel::detail::reduce_experts_by_data_parallel(*state->ep);
  }
  if (state->pp) {
    // Under PP the microbatches' gradients accumulate unsharded and are reduced once per step, after
    // the last backward (FSDP2's requires_gradient_sync under torchtitan's pipeline).
    std::vector<d::DataParallelState*> synced;
    for (parallel::DataParallel* dp : {state->dp.get(), state->expert_dp.get()}) {
      if (dp == nullptr) continue;
      synced.push_back(&d::mutable_state(*dp));
      synced.back()->gradient_sync = false;
    }
    if (!synced.empty()) {
      state->pp->set_step_end_hook([synced] {
        for (d::DataParallelState* dp : synced) dp->sync_gradients();
      });
    }
  }
  if (!state->tp && !state->dp) return Parallelized(std::move(state));

  auto contract = std::make_shared<d::PlanContract>();
  contract->model = state->model;
  std::unordered_set<const c10::TensorImpl*> seen;
  auto add = [&](const at::Tensor& p) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) return;
    const d::Binding* binding = d::find_binding(p);
    if (binding == nullptr) return;
    contract->params.emplace_back(binding->info.fqn, p);
  };
  if (state->tp) {
    for (const auto& p : state->tp->state().params) add(p);
    for (const auto& hook : state->tp->state().hooks) contract->hooks.emplace_back(hook.path, hook.hook.get());
  }
  for (const auto* dp : {state->dp.get(), state->expert_dp.get()}) {
    if (dp == nullptr) continue;
    for (const auto& unit : dp->state().units) {
      for (const auto& p : unit.params) add(p.param);
    }
  }
  if (state->ep) {
    for (const auto& p : state->ep->expert_parameters()) add(p);
  }
  for (const auto& [fqn, p] : contract->params) {
    d::attach_contract(p, contract);
    // A parameter read around with_param gets its gradient straight from autograd: that backward
    // runs the check too, even when nothing under the plan is read through with_param.
    if (p.requires_grad()) {
      std::weak_ptr<d::PlanContract> weak = contract;
      const unsigned position = p.register_hook([weak](const at::TensorBase&) {
        if (auto c = weak.lock()) c->on_backward();
      });
      state->leaf_hooks.emplace_back(p, position);
    }
  }
  state->contract = std::move(contract);
  return Parallelized(std::move(state));
}

}  // namespace titan
