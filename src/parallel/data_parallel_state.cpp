// SPDX-License-Identifier: BSD-3-Clause
#include "data_parallel_state.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include "titan/core/error.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/core/profile_scope.hpp"

namespace titan::parallel::detail {
namespace {

using torch::autograd::variable_list;

// Receives the gradient of every gathered parameter of one unit use that trains, then hands them to the state (by
// the parameter's index in the unit; a frozen one's stays undefined). Its inputs are the trained shard leaves; it
// returns no gradient for them: the state writes .grad itself once the asynchronous reduction is done.
struct UnshardBackward : torch::autograd::Node {
  UnshardBackward(DataParallelState* state, int64_t unit, std::vector<size_t> trained, size_t params)
      : state_(state), unit_(unit), trained_(std::move(trained)), params_(params) {}
  variable_list apply(variable_list&& grads) override {
    std::vector<at::Tensor> by_param(params_);
    for (size_t k = 0; k < trained_.size() && k < grads.size(); ++k) by_param[trained_[k]] = std::move(grads[k]);
    state_->post_backward(unit_, by_param);
    return variable_list(num_outputs());
  }
  std::string name() const override { return "titan::parallel::UnshardBackward"; }

 private:
  DataParallelState* state_;
  int64_t unit_;
  std::vector<size_t> trained_;  // the unit's indices of the parameters this node's inputs are
  size_t params_;
};

// Identity on a layer output; in backward it runs before that layer's own backward, so the unit's
// parameters are gathered again before any saved gathered tensor is read.
struct PreBackward : torch::autograd::Node {
  PreBackward(DataParallelState* state, int64_t unit) : state_(state), unit_(unit) {}
  variable_list apply(variable_list&& grads) override {
    state_->pre_backward(unit_);
    return std::move(grads);
  }
  std::string name() const override { return "titan::parallel::PreBackward"; }

 private:
  DataParallelState* state_;
  int64_t unit_;
};

// A new tensor object over the same bytes (no autograd view bookkeeping, its own version counter).
at::Tensor alias_of(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  return at::empty({0}, t.options()).set_(t);
}

}  // namespace

DataParallelState::DataParallelState(dist::ProcessGroup shard_group, dist::ProcessGroup replicate_group,
                                     DataParallelOptions opts, bool per_param_collectives)
    : shard(std::move(shard_group)),
      replicate(std::move(replicate_group)),
      options(std::move(opts)),
      per_param(per_param_collectives) {}

DataParallelState::~DataParallelState() {
  for (auto& p : pending_) {
    for (auto& work : p.works) {
      try {
        work.wait();
      } catch (...) {  // a destructor must not throw; the error was already reported by the step
      }
    }
  }
  for (auto& unit : units) {
    for (auto& p : unit.params) unbind_param(p.param);
  }
}

void DataParallelState::record(DataParallelEvent::Kind kind, int64_t unit) {
  if (options.trace) events.push_back({.kind = kind, .unit = unit});
}

at::Tensor DataParallelState::gathered_alias(const UnitParam& p) const {
  if (shard.size() == 1) {
    if (p.param.scalar_type() == options.param_dtype) return alias_of(p.param);
    at::NoGradGuard no_grad;
    return p.param.to(options.param_dtype);
  }
  at::NoGradGuard no_grad;
  const auto device = p.param.device();
  return at::empty({0}, at::TensorOptions().dtype(options.param_dtype).device(device))
      .set_(c10::Storage(p.gathered), 0, p.full_shape, c10::contiguous_strides(p.full_shape));
}

void DataParallelState::allocate_gathered(UnitParam& p) const {
  const size_t nbytes =
      static_cast<size_t>(c10::multiply_integers(p.full_shape)) * c10::elementSize(options.param_dtype);
  p.gathered->set_data_ptr_noswap(p.gathered->allocator()->allocate(nbytes));
  p.gathered->set_nbytes(nbytes);
}

void DataParallelState::start_gather(int64_t u) {
  Unit& unit = units[static_cast<size_t>(u)];
  if (shard.size() == 1 || unit.state != Unit::State::kSharded) return;
  const ProfileScope profile("FSDP::all_gather ", unit.name);  // issues the all-gather (async)
  at::NoGradGuard no_grad;
  const MemoryScope scope(MemoryCategory::communication);  // gathered storages and landing buffers
  if (per_param) {
    start_gather_per_param(unit);
  } else {
    start_gather_flat(unit);
  }
  unit.state = Unit::State::kGathering;
  record(DataParallelEvent::Kind::kGatherIssued, u);
}

void DataParallelState::start_gather_flat(Unit& unit) {
  std::vector<at::Tensor> flat;
  flat.reserve(unit.params.size());
  for (auto& p : unit.params) {
    if (p.float8) {
      start_gather_float8(unit, p);  // its own float8 all-gather
    } else {
      flat.push_back(p.param.reshape({-1}).to(options.param_dtype));
    }
  }
  if (flat.empty()) return;
  at::Tensor in = at::cat(flat);                                          // (high-precision chunk)
  at::Tensor out = at::empty({shard.size() * in.numel()}, in.options());  // (N * high-precision chunk)
  unit.gather_works.push_back(shard.all_gather(out, in));
  unit.gather_buffers = {std::move(in), std::move(out)};
}

void DataParallelState::start_gather_per_param(Unit& unit) {
  const int64_t n = shard.size();
  for (auto& p : unit.params) {
    if (p.float8) {
      start_gather_float8(unit, p);
      unit.gather_buffers.resize(unit.gather_buffers.size() + 2);  // keeps parameter i's pair at 2i
      continue;
    }
    allocate_gathered(p);
    at::Tensor in = p.param.to(options.param_dtype).contiguous();  // the shard itself when dtypes agree
    at::Tensor out;  // (N * rows_per_rank, ...): the gathered storage itself unless rows are padded
    out = n * p.rows_per_rank == p.full_shape[0] ? gathered_alias(p) : at::empty(p.padded_shape(n), in.options());
    unit.gather_works.push_back(shard.all_gather(out, in));
    unit.gather_buffers.push_back(std::move(in));
    unit.gather_buffers.push_back(std::move(out));
  }
}

void DataParallelState::finish_gather(int64_t u) {
  Unit& unit = units[static_cast<size_t>(u)];
  if (shard.size() == 1 || unit.state == Unit::State::kGathered) return;
  const ProfileScope profile("FSDP::all_gather_wait ", unit.name);  // waits for it, copies out of padding
  start_gather(u);
  for (auto& work : unit.gather_works) work.wait();
  unit.gather_works.clear();
  record(DataParallelEvent::Kind::kGatherWaited, u);
  at::NoGradGuard no_grad;
  const MemoryScope scope(MemoryCategory::communication);
  const int64_t n = shard.size();
  if (per_param) {
    for (size_t i = 0; i < unit.params.size(); ++i) {
      UnitParam& p = unit.params[i];
      if (p.float8) {
        finish_gather_float8(p);
        continue;
      }
      const at::Tensor& landed = unit.gather_buffers[2 * i + 1];  // (N * rows_per_rank, ...)
      if (landed.size(0) != p.full_shape[0]) gathered_alias(p).copy_(landed.narrow(0, 0, p.full_shape[0]));
    }
  } else {
    // (N, high-precision chunk): the flat buffer holds the parameters not gathered in float8
    const at::Tensor by_rank = unit.gather_buffers.empty() ? at::Tensor() : unit.gather_buffers[1].view({n, -1});
    int64_t offset = 0;
    for (auto& p : unit.params) {
      if (p.float8) {
        finish_gather_float8(p);
        continue;
      }
      allocate_gathered(p);
      const at::Tensor full =
          by_rank.narrow(1, offset, p.shard_numel()).reshape(p.padded_shape(n)).narrow(0, 0, p.full_shape[0]);
      offset += p.shard_numel();
      gathered_alias(p).copy_(full);  // a fresh alias: the saved gathered tensors' versions stay unchanged
    }
  }
  unit.gather_buffers.clear();
  unit.state = Unit::State::kGathered;
}

void DataParallelState::free_unit(int64_t u) {
  Unit& unit = units[static_cast<size_t>(u)];
  if (shard.size() == 1 || unit.state == Unit::State::kSharded) return;
  for (auto& work : unit.gather_works) work.wait();  // never free what a collective writes
  unit.gather_works.clear();
  for (auto& p : unit.params) {
    p.gathered->reset();
    if (p.float8) p.gathered8->reset();
    p.float8_buffers.clear();
  }
  unit.gather_buffers.clear();
  unit.state = Unit::State::kSharded;
  record(DataParallelEvent::Kind::kFreed, u);
}

void DataParallelState::free_all() {
  for (int64_t u = 0; u < static_cast<int64_t>(units.size()); ++u) {
    units[static_cast<size_t>(u)].outputs.clear();
    free_unit(u);
  }
  current_ = -1;
}

void DataParallelState::enter_unit(int64_t u) {
  if (current_ < 0 || u <= current_) float8_scales_stale = true;  // a new forward: parameters may have changed
  if (current_ >= 0) {
    units[static_cast<size_t>(current_)].outputs.clear();
    if (u <= current_) {
      free_all();  // a new forward (or a tied weight): shards may have changed since the last gather
    } else if (units[static_cast<size_t>(current_)].reshard_after_forward) {
      free_unit(current_);
    }
  }
  current_ = u;
  finish_gather(u);
  if (options.overlap && u + 1 < static_cast<int64_t>(units.size())) start_gather(u + 1);  // forward prefetch
}

Materialized DataParallelState::materialize(int64_t u, int64_t index) {
  if (u != current_) enter_unit(u);
  record(DataParallelEvent::Kind::kUse, u);
  Unit& unit = units[static_cast<size_t>(u)];
  const UnitParam& used = unit.params[static_cast<size_t>(index)];
  if (!c10::GradMode::is_enabled()) {
    if (!used.float8) return {.tensor = gathered_alias(used)};
    return {.tensor = float8_carrier(used), .float8 = GatheredFloat8{gathered_float8_alias(used), used.float8_scale}};
  }
  if (unit.outputs.empty()) {
    // One node per unit use: it fires once the gradients of the unit's trained parameters are in. A frozen one
    // (a LoRA run's base weight) is gathered all the same, for the forward and the input gradients, and gets none.
    std::vector<at::Tensor> leaves;
    std::vector<size_t> trained;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      if (!unit.params[i].param.requires_grad()) continue;
      leaves.push_back(unit.params[i].param);
      trained.push_back(i);
    }
    auto node = std::shared_ptr<UnshardBackward>(new UnshardBackward(this, u, std::move(trained), unit.params.size()),
                                                 torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(leaves));
    for (const auto& p : unit.params) {
      at::Tensor out = p.float8 ? float8_carrier(p) : gathered_alias(p);
      if (p.param.requires_grad()) torch::autograd::set_history(out, node);
      unit.outputs.push_back(std::move(out));
    }
  }
  const at::Tensor& out = unit.outputs[static_cast<size_t>(index)];
  if (!used.float8) return {.tensor = out};
  return {.tensor = out, .float8 = GatheredFloat8{gathered_float8_alias(used), used.float8_scale}};
}

at::Tensor DataParallelState::after_use(int64_t u, const at::Tensor& output) {
  if (shard.size() == 1 || !c10::GradMode::is_enabled() || !output.requires_grad()) return output;
  auto node = std::shared_ptr<PreBackward>(new PreBackward(this, u), torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(output));
  at::Tensor out = alias_of(output);
  torch::autograd::set_history(out, node);
  return out;
}

void DataParallelState::pre_backward(int64_t u) {
  finish_gather(u);
  if (options.overlap && u > 0) start_gather(u - 1);  // backward prefetch
}

void DataParallelState::post_backward(int64_t u, const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  Unit& unit = units[static_cast<size_t>(u)];
  if (!gradient_sync) {
    deferred.resize(units.size());
    auto& sums = deferred[static_cast<size_t>(u)];
    sums.resize(unit.params.size());
    for (size_t i = 0; i < unit.params.size() && i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      if (sums[i].defined()) {
        sums[i].add_(grads[i]);
      } else {
        const MemoryScope scope(MemoryCategory::gradients);  // the step's unsharded gradient accumulator
        sums[i] = grads[i].to(options.reduce_dtype, /*non_blocking=*/false, /*copy=*/true);
      }
    }
    unit.outputs.clear();
    free_unit(u);
    if (!callback_queued_) {
      callback_queued_ = true;
      torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
    }
    return;
  }
  const ProfileScope profile("FSDP::reduce_scatter ", unit.name);
  // Bound the reduce-scatters in flight to one: wait the earlier ones (their all-reduce may go on).
  for (auto& p : pending_) {
    if (p.stage == 0) progress(p, /*block=*/false);
  }
  pending_.push_back(per_param ? start_reduce_per_param(u, grads) : start_reduce_flat(u, grads));
  record(DataParallelEvent::Kind::kReduceIssued, u);
  if (shard.size() == 1) progress(pending_.back(), /*block=*/false);  // DDP: start the all-reduce now
  if (!options.overlap) progress(pending_.back(), /*block=*/true);    // no overlap: wait it here
  unit.outputs.clear();
  free_unit(u);  // FSDP2 frees after backward whatever the forward policy
  if (!callback_queued_) {
    callback_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
  }
}

at::Tensor DataParallelState::padded_grad(const UnitParam& p, const at::Tensor& grad) const {
  const std::vector<int64_t> padded = p.padded_shape(shard.size());
  const MemoryScope scope(MemoryCategory::communication);  // the reduce-scatter's input
  if (grad.defined() && padded[0] == p.full_shape[0]) return grad.to(options.reduce_dtype).contiguous();
  at::Tensor g = at::zeros(padded, p.param.options().dtype(options.reduce_dtype));  // (N * rows_per_rank, ...)
  if (grad.defined()) g.narrow(0, 0, p.full_shape[0]).copy_(grad);
  return g;
}

PendingReduce DataParallelState::start_reduce_flat(int64_t u, const std::vector<at::Tensor>& grads) {
  const Unit& unit = units[static_cast<size_t>(u)];
  const int64_t n = shard.size();
  std::vector<at::Tensor> columns;  // per trained parameter (N, shard_numel)
  columns.reserve(unit.params.size());
  int64_t chunk_numel = 0;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const UnitParam& p = unit.params[i];
    if (!p.param.requires_grad()) continue;
    columns.push_back(padded_grad(p, i < grads.size() ? grads[i] : at::Tensor()).view({n, p.shard_numel()}));
    chunk_numel += p.shard_numel();
  }
  PendingReduce reduce{.unit = u};
  if (columns.empty()) return reduce;  // nothing of the unit trains
  const MemoryScope scope(MemoryCategory::communication);
  reduce.in.push_back(columns.size() == 1 ? columns[0] : at::cat(columns, 1));  // (N, chunk_numel)
  reduce.out.push_back(at::empty({chunk_numel}, reduce.in[0].options()));
  reduce.works.push_back(shard.reduce_scatter(reduce.out[0], reduce.in[0]));
  return reduce;
}

PendingReduce DataParallelState::start_reduce_per_param(int64_t u, const std::vector<at::Tensor>& grads) {
  const Unit& unit = units[static_cast<size_t>(u)];
  PendingReduce reduce{.unit = u};
  const at::Tensor none;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const UnitParam& p = unit.params[i];
    if (!p.param.requires_grad()) {  // frozen: no gradient to reduce (an undefined entry keeps the indices)
      reduce.out.emplace_back();
      continue;
    }
    const at::Tensor& grad = i < grads.size() ? grads[i] : none;  // both lvalues: no copy, no extra reference
    at::Tensor in = padded_grad(p, grad);                         // (N * rows_per_rank, ...)
    if (shard.size() == 1) {
      // DDP: the all-reduce works in place, and autograd may have handed the same gradient tensor to
      // another node too (e.g. both inputs of an add): reduce a copy unless only we hold it.
      const bool ours = !in.is_same(grad) || (grad.use_count() == 2 && grad.storage().use_count() == 1);
      const MemoryScope scope(MemoryCategory::gradients);  // becomes the parameter's .grad
      reduce.out.push_back(ours ? in.view(p.param.sizes()) : in.view(p.param.sizes()).clone());
      continue;
    }
    const MemoryScope scope(MemoryCategory::gradients);         // becomes the shard's .grad
    at::Tensor out = at::empty(p.param.sizes(), in.options());  // (rows_per_rank, ...)
    reduce.works.push_back(shard.reduce_scatter(out, in));
    reduce.in.push_back(std::move(in));
    reduce.out.push_back(std::move(out));
  }
  return reduce;
}

void DataParallelState::progress(PendingReduce& p, bool block) {
  if (p.stage == 0) {
    for (auto& work : p.works) work.wait();
    p.works.clear();
    p.in.clear();
    if (replicate.size() > 1) {
      for (auto& out : p.out) {
        if (out.defined()) p.works.push_back(replicate.all_reduce(out));
      }
      p.stage = 1;
    } else {
      p.stage = 2;
    }
  }
  if (p.stage == 1 && block) {
    for (auto& work : p.works) work.wait();
    p.works.clear();
    p.stage = 2;
  }
  if (p.stage != 2) return;
  record(DataParallelEvent::Kind::kReduceWaited, p.unit);
  const MemoryScope scope(MemoryCategory::gradients);  // what lands in .grad
  auto& params = units[static_cast<size_t>(p.unit)].params;
  int64_t offset = 0;  // in the flat buffer, which holds the trained parameters only
  for (size_t i = 0; i < params.size(); ++i) {
    UnitParam& param = params[i];
    if (!param.param.requires_grad() || p.out.empty()) continue;
    // Flat: this parameter's slice of the unit's buffer, cloned so the buffer can go; per parameter:
    // its own reduced tensor, used as it is.
    at::Tensor grad = per_param ? p.out[i].to(param.param.scalar_type())
                                : p.out[0]
                                      .narrow(0, offset, param.shard_numel())
                                      .view(param.param.sizes())
                                      .to(param.param.scalar_type())
                                      .clone(at::MemoryFormat::Contiguous);
    offset += param.shard_numel();
    at::Tensor& slot = param.param.mutable_grad();
    if (slot.defined()) {
      slot.add_(grad);
    } else {
      slot = std::move(grad);
    }
  }
  p.out.clear();
  p.stage = 3;
}

void DataParallelState::finish_backward() {
  const ProfileScope profile("FSDP::finish_backward");  // waits for the last reductions
  callback_queued_ = false;
  for (auto& p : pending_) progress(p, /*block=*/true);
  pending_.clear();
  free_all();
  record(DataParallelEvent::Kind::kBackwardDone, -1);
}

void DataParallelState::sync_gradients() {
  const ProfileScope profile("FSDP::sync_gradients");
  at::NoGradGuard no_grad;
  for (int64_t u = 0; u < static_cast<int64_t>(deferred.size()); ++u) {
    auto& sums = deferred[static_cast<size_t>(u)];
    if (sums.empty()) continue;
    pending_.push_back(per_param ? start_reduce_per_param(u, sums) : start_reduce_flat(u, sums));
    record(DataParallelEvent::Kind::kReduceIssued, u);
    if (shard.size() == 1) progress(pending_.back(), /*block=*/false);  // DDP: start the all-reduce now
  }
  deferred.clear();
  for (auto& p : pending_) progress(p, /*block=*/true);
  pending_.clear();
}

int64_t DataParallelState::gathered_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units) {
    for (const auto& p : unit.params) {
      if (p.gathered) bytes += static_cast<int64_t>(p.gathered->nbytes());
      if (p.gathered8) bytes += static_cast<int64_t>(p.gathered8->nbytes());
    }
  }
  return bytes;
}

}  // namespace titan::parallel::detail
