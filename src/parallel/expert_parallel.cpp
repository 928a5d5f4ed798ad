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

// Rows that arrived by source rank, then by expert (counts[s * experts + e] of them from rank s for
// expert e, (sources * experts) int64 CPU), reordered by expert, then by source rank, as the grouped
// GEMM wants them: perm[i] = the received row that goes i-th.
at::Tensor expert_major_order(const at::Tensor& counts, int64_t sources, int64_t experts) {
  const int64_t* c = counts.data_ptr<int64_t>();
  const int64_t blocks = sources * experts;
  std::vector<int64_t> start(static_cast<size_t>(blocks));
  std::exclusive_scan(c, c + blocks, start.begin(), int64_t{0});
  const int64_t rows = start.empty() ? 0 : start.back() + c[blocks - 1];
  at::Tensor perm = at::empty({rows}, at::kLong);  // (M)
  int64_t* p = perm.data_ptr<int64_t>();
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t s = 0; s < sources; ++s) {
      const int64_t block = s * experts + e;
      for (int64_t i = 0; i < c[block]; ++i) *p++ = start[static_cast<size_t>(block)] + i;
    }
  }
  return perm;
}

// The token exchanges of one MoE layer (torchtitan's ExpertParallel / ExpertTensorParallel
// _token_dispatch and _token_combine, with host-built permutations): over ep, each slot goes to the
// rank of its expert and comes back; over etp (tp, or no axis), every tp rank's slots for this rank's
// experts are gathered before the experts, whose hidden dim is split over etp, and their partial
// outputs are summed back onto the rank that routed them (a reduce-scatter).
class TokenDispatch final : public nn::RoutedExpertsDispatch {
 public:
  TokenDispatch(dist::ProcessGroup ep, dist::ProcessGroup etp, std::shared_ptr<Timer> timer)
      : ep_(std::move(ep)), etp_(std::move(etp)), timer_(std::move(timer)) {}

  at::Tensor run(const nn::GroupedExperts& experts, const at::Tensor& x,
                 const at::Tensor& tokens_per_expert) const override {
    if (ep_.size() == 1) return tensor_parallel_experts(experts, x, tokens_per_expert.to(x.device(), at::kLong));
    const int64_t n = ep_.size();
    const int64_t num_experts = tokens_per_expert.size(0);
    const int64_t local = num_experts / n;
    // Counts first: recv_counts[s * local + e] = slots rank s sends to my expert e.
    at::Tensor send_counts = tokens_per_expert.to(x.device(), at::kLong).contiguous();  // (E)
    at::Tensor recv_counts = at::empty_like(send_counts);                               // (E)
    const bool timed = timing(timer_.get());
    const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    ep_.all_to_all(recv_counts, send_counts).wait();
    if (timed) timer_->count_nanoseconds += nanoseconds_since(t0);
    const at::Tensor sent = send_counts.to(at::kCPU);      // (E)
    const at::Tensor received = recv_counts.to(at::kCPU);  // (E): (source rank, local expert)
    std::vector<int64_t> in_splits = block_sums(sent, n);
    std::vector<int64_t> out_splits = block_sums(received, n);
    // The slots arrive by source rank, then by local expert; the experts want them by local expert.
    const at::Tensor perm = expert_major_order(received, n, local).to(x.device());                        // (M)
    const at::Tensor inverse = at::argsort(perm);                                                         // (M)
    const at::Tensor local_counts = recv_counts.view({n, local}).sum(0);                                  // (E/ep)
    at::Tensor routed = all_to_all_v_timed(x, ep_, out_splits, in_splits, timer_).index_select(0, perm);  // (M, D)
    at::Tensor out = tensor_parallel_experts(experts, routed, local_counts).index_select(0, inverse);     // (M, D)
    return all_to_all_v_timed(out, ep_, in_splits, out_splits, timer_);                                   // (N, D)
  }

 private:
  // x (M, D) sorted by local expert, counts (L) int64 on x's device -> (M, D): this rank's experts on
  // its slots. Under etp the tp ranks hold different slots (sequence parallel) and each its 1/etp of
  // every expert's hidden dim: every rank runs its slice on the slots of all, and each slot's partial
  // outputs are summed on the rank it came from. Both exchanges are all_to_all_v, so autograd
  // reverses them: the gather's gradient is the matching reduce-scatter and the other way round.
  at::Tensor tensor_parallel_experts(const nn::GroupedExperts& experts, const at::Tensor& x,
                                     const at::Tensor& counts) const {
    if (etp_.size() == 1) return experts.forward(x, counts);
    const int64_t n = etp_.size();
    const int64_t local = counts.size(0);
    const int64_t rows = x.size(0);
    at::Tensor all_counts = at::empty({n * local}, counts.options());  // (etp * L): (source rank, expert)
    etp_.all_gather(all_counts, counts.contiguous()).wait();
    const at::Tensor gathered_counts = all_counts.to(at::kCPU);  // (etp * L)
    const std::vector<int64_t> mine(static_cast<size_t>(n), rows);
    const std::vector<int64_t> theirs = block_sums(gathered_counts, n);
    const at::Tensor perm = expert_major_order(gathered_counts, n, local).to(x.device());  // (sum theirs)
    const at::Tensor inverse = at::argsort(perm);                                          // (sum theirs)
    // Sending my slots whole to every etp rank is an all-gather with uneven parts.
    at::Tensor gathered = all_to_all_v(x.repeat({n, 1}), etp_, theirs, mine).index_select(0, perm);  // (sum theirs, D)
    at::Tensor partial = experts.forward(gathered, all_counts.view({n, local}).sum(0)).index_select(0, inverse);
    // partial (sum theirs, D): this rank's hidden slice, by source rank; each source gets its rows back
    // from every etp rank and adds the n partial sums.
    return all_to_all_v(partial, etp_, mine, theirs).view({n, rows, x.size(1)}).sum(0);  // (M, D)
  }

  dist::ProcessGroup ep_;
  dist::ProcessGroup etp_;
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

// The dim of a stacked expert weight that expert tensor parallelism splits: the hidden dim F, the rows
// of w1/w3 (E, F, D) (column-parallel) and the columns of w2 (E, D, F) (row-parallel), as torchtitan's
// ExpertTensorParallel places them (Shard(1), Shard(2), Shard(1) on etp).
int64_t hidden_dim_of(const std::string& name) { return name == "w2" ? 2 : 1; }

// Records that w now holds rows [offset[d], offset[d] + local[d]) of a whole of `global` along each
// split dim (experts on ep, hidden features on etp), keeping what tensor parallelism bound before (a
// sequence-parallel gradient sum, only while the experts are whole over tp) and casting to the compute
// dtype FSDP would have gathered it in.
void bind_expert_shard(const std::string& fqn, const at::Tensor& w, std::vector<int64_t> global,
                       std::vector<int64_t> offset, std::vector<std::pair<std::string, Placement>> placements,
                       int64_t etp, at::ScalarType compute_dtype) {
  const detail::Binding* prior = detail::find_binding(w);
  TITAN_CHECK_VALUE(prior == nullptr || (prior->handler == nullptr && prior->info.placements.empty()),
                    "[titan::parallel::apply_expert_parallel] expected '{}' whole before expert parallelism, got it "
                    "already sharded ({}). Apply expert parallelism after tensor parallelism and before data "
                    "parallelism (titan::parallelize does), with the experts replicated over tp.",
                    fqn, prior ? prior->info.placements_str() : "");
  TITAN_CHECK_VALUE(etp == 1 || prior == nullptr || !prior->transform,
                    "[titan::parallel::apply_expert_parallel] expected '{}' outside the tensor-parallel plan under "
                    "expert tensor parallelism (etp {}), got it under a SequenceParallel style, which would sum its "
                    "gradient over tp although each tp rank holds a different slice. Name the MoE's router and "
                    "shared experts in plan.tensor_parallel instead of the whole MoE (parallel::tensor_parallel_plan "
                    "with sharded_experts = true does), or set parallelism.expert_tensor_parallel_degree 1.",
                    fqn, etp);
  std::function<at::Tensor(const at::Tensor&)> transform = prior ? prior->transform : nullptr;
  if (compute_dtype != at::ScalarType::Undefined && compute_dtype != w.scalar_type()) {
    transform = [before = std::move(transform), compute_dtype](const at::Tensor& t) {
      return (before ? before(t) : t).to(compute_dtype);
    };
  }
  ShardedParam info;
  info.global_shape = std::move(global);
  info.placements = std::move(placements);
  info.offset = std::move(offset);
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
  ep.etp_ = mesh.size("etp");
  ep.efsdp_ = mesh.size("efsdp");
  ep.expert_replicas_ = {mesh.group("efsdp"), mesh.group("dp_replicate")};
  // dp x cp ranks hold different tokens; under sequence parallel so do the tp ranks (a MoE fed whole
  // sequences counts the same tokens on each, doubling every count: the sign update does not mind).
  ep.loss_ranks_ = {mesh.group("dp_cp"), mesh.group("tp")};
  const int64_t rank = mesh.coordinate("ep");
  const int64_t etp_rank = mesh.coordinate("etp");
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
    if (ep.etp_ > 1) {
      const int64_t hidden = moe->experts->w1.size(1);
      TITAN_CHECK_VALUE(hidden % ep.etp_ == 0,
                        "[titan::parallel::apply_expert_parallel] expected parallelism.expert_tensor_parallel_degree "
                        "to divide the experts' hidden dim {} of '{}', got etp {}. Set "
                        "parallelism.expert_tensor_parallel_degree 1 or a tensor_parallel_degree dividing it.",
                        hidden, path, ep.etp_);
      // w2's bias is added after the row-parallel w2: each etp rank would add it to its partial sum.
      TITAN_CHECK_NOT_IMPLEMENTED(!moe->args.biased_experts,
                                  "[titan::parallel::apply_expert_parallel] expected experts without biases under "
                                  "expert tensor parallelism (etp {}), got biased experts in '{}' (gpt-oss). Set "
                                  "parallelism.expert_tensor_parallel_degree 1.",
                                  ep.etp_, path);
    }
    layers.push_back(std::move(moe));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string& path = plan.moe_modules[i];
    std::shared_ptr<nn::MoE>& moe = layers[i];
    const int64_t experts = moe->args.num_experts;
    if (ep.ep_ > 1 || ep.etp_ > 1) {
      const int64_t local = experts / ep.ep_;
      at::NoGradGuard no_grad;
      for (const auto& [name, w] : moe->experts->stacked_parameters()) {
        const std::string fqn = fmt::format("{}.experts.{}", path, name);
        TITAN_CHECK_VALUE(w->size(0) == experts,
                          "[titan::parallel::apply_expert_parallel] expected '{}' to hold all {} experts, got {} "
                          "rows. Apply expert parallelism once per model.",
                          fqn, experts, w->size(0));
        std::vector<int64_t> global = w->sizes().vec();
        std::vector<int64_t> offset(global.size(), 0);
        std::vector<std::pair<std::string, Placement>> placements;
        at::Tensor shard = *w;  // (E, ...)
        if (ep.ep_ > 1) {
          shard = shard.narrow(0, rank * local, local);  // (E/ep, ...): this rank's experts, Shard(0) on ep
          offset[0] = rank * local;
          placements.emplace_back("ep", Placement::shard(0));
        }
        if (ep.etp_ > 1) {
          const int64_t dim = hidden_dim_of(name);
          const int64_t slice = global[static_cast<size_t>(dim)] / ep.etp_;
          // (E/ep, F/etp, D) for w1/w3, (E/ep, D, F/etp) for w2: Shard(dim) on etp
          shard = shard.narrow(dim, etp_rank * slice, slice);
          offset[static_cast<size_t>(dim)] = etp_rank * slice;
          placements.emplace_back("etp", Placement::shard(dim));
        }
        w->set_data(shard.clone());
        bind_expert_shard(fqn, *w, std::move(global), std::move(offset), std::move(placements), ep.etp_,
                          plan.compute_dtype);
        bound->params.push_back(*w);
      }
      moe->dispatch = std::make_shared<TokenDispatch>(mesh.group("ep"), mesh.group("etp"), ep.timer_);
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
  if ((ep_ == 1 && etp_ == 1) || data_parallel_experts_) return;  // data parallelism reduced them
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
  if (layers_.empty() || (ep_ == 1 && etp_ == 1)) return "no EP";
  if (etp_ == 1) return fmt::format("EP(ep={}, efsdp={}, MoE layers: {})", ep_, efsdp_, layers_.size());
  return fmt::format("EP(ep={}, etp={}, efsdp={}, MoE layers: {})", ep_, etp_, efsdp_, layers_.size());
}

}  // namespace titan::parallel
