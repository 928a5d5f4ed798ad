// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/expert_parallel.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/nn/module.h>

#include <chrono>
#include <numeric>
#include <utility>

#include "../layout/binding.hpp"
#include "find_module.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/moe.hpp"

namespace titan::parallel {
namespace {

using torch::autograd::variable_list;

using Timer = detail::AllToAllTimer;

bool timing(const Timer* timer) { return timer != nullptr && timer->on.load(std::memory_order_relaxed); }

int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// timer: books the exchange (time, bytes sent off this rank) when on; null for untimed callers.
at::Tensor exchange(const at::Tensor& x, const dist::ProcessGroup& group, const std::vector<int64_t>& out_splits,
                    const std::vector<int64_t>& in_splits, Timer* timer = nullptr) {
  const bool timed = timing(timer);
  const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  const int64_t rows = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  auto sizes = x.sizes().vec();
  sizes[0] = rows;
  at::Tensor out = at::empty(sizes, x.options());  // (sum(out_splits), *x.shape[1:])
  group.all_to_all(out, x.contiguous(), out_splits, in_splits).wait();
  if (timed) {
    const int64_t kept = group.size() > 1 ? in_splits[static_cast<size_t>(group.rank())] : x.size(0);
    const int64_t row_bytes = x.size(0) > 0 ? x.numel() / x.size(0) * x.element_size() : 0;
    timer->nanoseconds += nanoseconds_since(t0);
    timer->bytes_sent += (x.size(0) - kept) * row_bytes;
    ++timer->exchanges;
  }
  return out;
}

at::Tensor all_to_all_v_timed(const at::Tensor& x, const dist::ProcessGroup& group, std::vector<int64_t> out_splits,
                              std::vector<int64_t> in_splits, std::shared_ptr<Timer> timer);

// The gradient of all_to_all_v: the same exchange with the splits swapped.
struct AllToAllVBackward : torch::autograd::Node {
  AllToAllVBackward(dist::ProcessGroup group, std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                    std::shared_ptr<Timer> timer)
      : group_(std::move(group)),
        out_splits_(std::move(out_splits)),
        in_splits_(std::move(in_splits)),
        timer_(std::move(timer)) {}
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    at::NoGradGuard no_grad;
    return {exchange(grads[0], group_, in_splits_, out_splits_, timer_.get())};
  }
  std::string name() const override { return "titan::parallel::AllToAllVBackward"; }

 private:
  dist::ProcessGroup group_;
  std::vector<int64_t> out_splits_;
  std::vector<int64_t> in_splits_;
  std::shared_ptr<Timer> timer_;
};

std::vector<int64_t> block_sums(const at::Tensor& counts, int64_t blocks) {  // counts (blocks * per) int64 CPU
  const at::Tensor sums = counts.view({blocks, -1}).sum(1).contiguous();     // (blocks)
  return {sums.data_ptr<int64_t>(), sums.data_ptr<int64_t>() + blocks};
}

// The token exchange of one MoE layer over the ep group (torchtitan's ExpertParallel
// _token_dispatch / _token_combine, with a host-built permutation).
class AllToAllDispatch final : public nn::RoutedExpertsDispatch {
 public:
  AllToAllDispatch(dist::ProcessGroup group, std::shared_ptr<Timer> timer)
      : group_(std::move(group)), timer_(std::move(timer)) {}

  at::Tensor run(const nn::GroupedExperts& experts, const at::Tensor& x,
                 const at::Tensor& tokens_per_expert) const override {
    const int64_t n = group_.size();
    const int64_t num_experts = tokens_per_expert.size(0);
    const int64_t local = num_experts / n;
    // Counts first: recv_counts[s * local + e] = slots rank s sends to my expert e.
    at::Tensor send_counts = tokens_per_expert.to(x.device(), at::kLong).contiguous();  // (E)
    at::Tensor recv_counts = at::empty_like(send_counts);                               // (E)
    const bool timed = timing(timer_.get());
    const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    group_.all_to_all(recv_counts, send_counts).wait();
    if (timed) timer_->count_nanoseconds += nanoseconds_since(t0);
    const at::Tensor sent = send_counts.to(at::kCPU);      // (E)
    const at::Tensor received = recv_counts.to(at::kCPU);  // (E): (source rank, local expert)
    std::vector<int64_t> in_splits = block_sums(sent, n);
    std::vector<int64_t> out_splits = block_sums(received, n);
    // The slots arrive by source rank, then by local expert; the experts want them by local expert,
    // then by source rank: perm[i] = the received row that goes i-th.
    const int64_t* c = received.data_ptr<int64_t>();
    std::vector<int64_t> start(static_cast<size_t>(num_experts));
    std::exclusive_scan(c, c + num_experts, start.begin(), int64_t{0});
    const int64_t rows = start.empty() ? 0 : start.back() + c[num_experts - 1];
    at::Tensor perm = at::empty({rows}, at::kLong);  // (M)
    int64_t* p = perm.data_ptr<int64_t>();
    for (int64_t e = 0; e < local; ++e) {
      for (int64_t s = 0; s < n; ++s) {
        const int64_t block = s * local + e;
        for (int64_t i = 0; i < c[block]; ++i) *p++ = start[static_cast<size_t>(block)] + i;
      }
    }
    perm = perm.to(x.device());
    const at::Tensor inverse = at::argsort(perm);                                                            // (M)
    const at::Tensor local_counts = recv_counts.view({n, local}).sum(0);                                     // (E/ep)
    at::Tensor routed = all_to_all_v_timed(x, group_, out_splits, in_splits, timer_).index_select(0, perm);  // (M, D)
    at::Tensor out = experts.forward(routed, local_counts).index_select(0, inverse);                         // (M, D)
    return all_to_all_v_timed(out, group_, in_splits, out_splits, timer_);                                   // (N, D)
  }

 private:
  dist::ProcessGroup group_;
  std::shared_ptr<Timer> timer_;
};

void all_reduce_grads(const std::vector<at::Tensor>& params, const dist::ProcessGroup& group) {
  if (group.size() == 1) return;
  for (const at::Tensor& p : params) {
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad().contiguous();
    group.all_reduce(g).wait();
    if (!g.is_same(p.grad())) p.mutable_grad().copy_(g);
  }
}

}  // namespace

namespace {

at::Tensor all_to_all_v_timed(const at::Tensor& x, const dist::ProcessGroup& group, std::vector<int64_t> out_splits,
                              std::vector<int64_t> in_splits, std::shared_ptr<Timer> timer) {
  TITAN_CHECK_VALUE(x.dim() >= 1, "[titan::parallel::all_to_all_v] expected a tensor with rows, got a scalar.");
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = exchange(x, group, out_splits, in_splits, timer.get());
  }
  if (c10::GradMode::is_enabled() && x.requires_grad()) {
    auto node = std::shared_ptr<AllToAllVBackward>(
        new AllToAllVBackward(group, std::move(out_splits), std::move(in_splits), std::move(timer)),
        torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    torch::autograd::set_history(out, node);
  }
  return out;
}

// The layouts apply_expert_parallel bound, withdrawn when the last copy of the ExpertParallel goes:
// a later read of a shard through with_param is then an error, not a silent local tensor.
struct ExpertBindings {
  std::vector<at::Tensor> params;
  ExpertBindings() = default;
  ExpertBindings(const ExpertBindings&) = delete;
  ExpertBindings& operator=(const ExpertBindings&) = delete;
  ~ExpertBindings() {
    for (const at::Tensor& p : params) {
      const detail::Binding* binding = detail::find_binding(p);
      if (binding == nullptr || !binding->orphaned.empty()) continue;
      detail::orphan_param(p, fmt::format("[titan::parallel::with_param] expected '{}' to be used while its "
                                          "ExpertParallel (or the titan::Parallelized handle) is alive, got a read "
                                          "after it was destroyed (the parameter holds only this rank's experts). "
                                          "Keep the handle alive as long as the model.",
                                          binding->info.fqn));
    }
  }
};

// Records that w (E, ...) now holds experts [offset, offset + E/ep) of a whole of `global` rows, keeping
// what tensor parallelism bound before (a sequence-parallel gradient sum) and casting to the compute
// dtype FSDP would have gathered it in.
void bind_expert_shard(const std::string& fqn, const at::Tensor& w, std::vector<int64_t> global, int64_t offset,
                       at::ScalarType compute_dtype) {
  const detail::Binding* prior = detail::find_binding(w);
  TITAN_CHECK_VALUE(prior == nullptr || (prior->handler == nullptr && prior->info.placements.empty()),
                    "[titan::parallel::apply_expert_parallel] expected '{}' whole before expert parallelism, got it "
                    "already sharded ({}). Apply expert parallelism after tensor parallelism and before data "
                    "parallelism (titan::parallelize does), with the experts replicated over tp.",
                    fqn, prior ? prior->info.placements_str() : "");
  std::function<at::Tensor(const at::Tensor&)> transform = prior ? prior->transform : nullptr;
  if (compute_dtype != at::ScalarType::Undefined && compute_dtype != w.scalar_type()) {
    transform = [before = std::move(transform), compute_dtype](const at::Tensor& t) {
      return (before ? before(t) : t).to(compute_dtype);
    };
  }
  ShardedParam info;
  info.global_shape = std::move(global);
  info.placements = {{"ep", Placement::shard(0)}};
  info.offset.assign(info.global_shape.size(), 0);
  info.offset[0] = offset;
  info.local_shape = w.sizes().vec();
  info.fqn = fqn;
  info.local = w;
  detail::bind_param(w, {.info = std::move(info),
                         .handler = nullptr,
                         .unit = 0,
                         .index = 0,
                         .transform = std::move(transform),
                         .contract = nullptr,
                         .used = {},
                         .orphaned = {}});
}

}  // namespace

at::Tensor all_to_all_v(const at::Tensor& x, const dist::ProcessGroup& group, std::vector<int64_t> out_splits,
                        std::vector<int64_t> in_splits) {
  return all_to_all_v_timed(x, group, std::move(out_splits), std::move(in_splits), nullptr);
}

std::vector<std::string> moe_modules(const torch::nn::Module& model) {
  std::vector<std::string> paths;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (dynamic_cast<const nn::MoE*>(item.value().get()) != nullptr) paths.push_back(item.key());
  }
  return paths;
}

std::string format_as(const ExpertParallelPlan& plan) {
  return fmt::format("ExpertParallel({})", fmt::join(plan.moe_modules, ", "));
}

ExpertParallel apply_expert_parallel(torch::nn::Module& model, const dist::Mesh& mesh, const ExpertParallelPlan& plan) {
  ExpertParallel ep;
  ep.ep_ = mesh.size("ep");
  ep.efsdp_ = mesh.size("efsdp");
  ep.expert_replicas_ = {mesh.group("efsdp"), mesh.group("dp_replicate")};
  // dp x cp ranks hold different tokens; under sequence parallel so do the tp ranks (a MoE fed whole
  // sequences counts the same tokens on each, doubling every count: the sign update does not mind).
  ep.loss_ranks_ = {mesh.group("dp_cp"), mesh.group("tp")};
  const int64_t rank = mesh.coordinate("ep");
  auto bound = std::make_shared<ExpertBindings>();
  // Every layer is checked before any is sharded.
  std::vector<std::shared_ptr<nn::MoE>> layers;
  for (const std::string& path : plan.moe_modules) {
    torch::nn::Module& module = detail::find_module(model, path, "expert_parallel");
    std::shared_ptr<nn::MoE> moe;
    for (const auto& item : model.named_modules("", /*include_self=*/false)) {  // the root: not a layer
      if (item.value().get() == &module) moe = std::dynamic_pointer_cast<nn::MoE>(item.value());
    }
    TITAN_CHECK_VALUE(moe != nullptr,
                      "[titan::parallel::apply_expert_parallel] expected plan.expert_parallel path '{}' to name an "
                      "nn::MoE, got a {}. List the MoE layers only.",
                      path, module.name());
    const int64_t experts = moe->args.num_experts;
    TITAN_CHECK_VALUE(experts % ep.ep_ == 0,
                      "[titan::parallel::apply_expert_parallel] expected parallelism.expert_parallel_degree to "
                      "divide the {} experts of '{}', got ep {}. Choose an ep that divides num_experts.",
                      experts, path, ep.ep_);
    layers.push_back(std::move(moe));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string& path = plan.moe_modules[i];
    std::shared_ptr<nn::MoE>& moe = layers[i];
    const int64_t experts = moe->args.num_experts;
    if (ep.ep_ > 1) {
      const int64_t local = experts / ep.ep_;
      at::NoGradGuard no_grad;
      for (const auto& [name, w] : moe->experts->stacked_parameters()) {
        const std::string fqn = fmt::format("{}.experts.{}", path, name);
        TITAN_CHECK_VALUE(w->size(0) == experts,
                          "[titan::parallel::apply_expert_parallel] expected '{}' to hold all {} experts, got {} "
                          "rows. Apply expert parallelism once per model.",
                          fqn, experts, w->size(0));
        std::vector<int64_t> global = w->sizes().vec();
        w->set_data(w->narrow(0, rank * local, local).clone());  // (E/ep, ...): this rank's experts
        bind_expert_shard(fqn, *w, std::move(global), rank * local, plan.compute_dtype);
        bound->params.push_back(*w);
      }
      moe->dispatch = std::make_shared<AllToAllDispatch>(mesh.group("ep"), ep.timer_);
    }
    ep.layers_.push_back(std::move(moe));
  }
  if (!bound->params.empty()) ep.bindings_ = std::move(bound);
  return ep;
}

std::vector<at::Tensor> ExpertParallel::expert_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& moe : layers_) {
    for (const auto& [name, w] : moe->experts->stacked_parameters()) out.push_back(*w);
  }
  return out;
}

void detail::reduce_experts_by_data_parallel(ExpertParallel& ep) { ep.data_parallel_experts_ = true; }

void ExpertParallel::reduce_expert_gradients(double divide_by) const {
  if (ep_ == 1 || data_parallel_experts_) return;  // data parallelism reduced them
  const std::vector<at::Tensor> params = expert_parameters();
  for (const dist::ProcessGroup& group : expert_replicas_) all_reduce_grads(params, group);
  if (divide_by == 1.0) return;
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) p.mutable_grad().div_(divide_by);
  }
}

std::vector<at::Tensor> ExpertParallel::update_expert_bias() const {
  std::vector<at::Tensor> counts;
  for (const auto& moe : layers_) {
    if (moe->expert_bias.defined()) counts.push_back(moe->tokens_per_expert);
  }
  if (counts.empty()) return {};
  at::NoGradGuard no_grad;
  for (const dist::ProcessGroup& group : loss_ranks_) {
    if (group.size() == 1) continue;
    at::Tensor flat = at::cat(counts);  // (sum of E): every layer's counts, one all-reduce
    group.all_reduce(flat).wait();
    int64_t offset = 0;
    for (at::Tensor& c : counts) {
      c.copy_(flat.narrow(0, offset, c.numel()));
      offset += c.numel();
    }
  }
  std::vector<at::Tensor> loads;  // (E) each: the summed counts, before the update zeroes them
  loads.reserve(counts.size());
  for (const at::Tensor& c : counts) loads.push_back(c.clone());
  for (const auto& moe : layers_) moe->update_expert_bias(moe->args.load_balance_coeff);
  return loads;
}

AllToAllStats ExpertParallel::all_to_all_stats() const {
  return {.exchanges = timer_->exchanges,
          .bytes_sent = timer_->bytes_sent,
          .seconds = static_cast<double>(timer_->nanoseconds) * 1e-9,
          .count_seconds = static_cast<double>(timer_->count_nanoseconds) * 1e-9};
}

void ExpertParallel::reset_all_to_all_stats() const {
  timer_->exchanges = timer_->bytes_sent = timer_->nanoseconds = timer_->count_nanoseconds = 0;
}

std::string ExpertParallel::describe() const {
  if (layers_.empty() || ep_ == 1) return "no EP";
  return fmt::format("EP(ep={}, efsdp={}, MoE layers: {})", ep_, efsdp_, layers_.size());
}

}  // namespace titan::parallel
