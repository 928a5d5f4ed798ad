// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/semi_sync.hpp"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/replica_group.hpp"

namespace titan {

SemiSyncOptions semi_sync_options(const FaultToleranceConfig& ft) {
  TITAN_CHECK_VALUE(ft.semi_sync_method.has_value(),
                    "[titan::semi_sync_options] expected fault_tolerance.semi_sync_method set, got none.");
  return {.method = *ft.semi_sync_method == "local_sgd" ? SemiSyncMethod::local_sgd : SemiSyncMethod::diloco,
          .sync_steps = ft.sync_steps,
          .outer_lr = ft.outer_lr,
          .outer_momentum = ft.outer_momentum,
          .outer_nesterov = ft.outer_nesterov,
          .fragment_update_alpha = ft.fragment_update_alpha};
}

SemiSync::SemiSync(SemiSyncOptions options, std::vector<at::Tensor> parameters)
    : options_(options), parameters_(std::move(parameters)) {
  TITAN_CHECK_VALUE(options_.sync_steps >= 1, "[titan::SemiSync] expected sync_steps >= 1, got {}.",
                    options_.sync_steps);
  if (options_.method != SemiSyncMethod::diloco) return;
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : parameters_) {
    last_sync_.push_back(p.detach().clone());         // like p
    momentum_.push_back(at::zeros_like(p.detach()));  // like p
  }
}

void SemiSync::start() {
  if (restored_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < last_sync_.size(); ++i) {
    last_sync_[i].copy_(parameters_[i].detach());
    momentum_[i].zero_();
  }
  restored_ = true;
}

std::vector<at::Tensor> SemiSync::contribution(bool counts) const {
  at::NoGradGuard no_grad;
  const double weight = counts ? 1.0 : 0.0;
  std::vector<at::Tensor> out;
  out.reserve(parameters_.size() + 1);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor p = parameters_[i].detach();
    // torchft's pseudo-gradient: the global parameters minus the local ones, so the outer SGD descends along it.
    out.push_back((options_.method == SemiSyncMethod::diloco ? last_sync_[i] - p : p.clone()).mul_(weight));
  }
  out.push_back(at::full({1}, weight, parameters_.front().options()));  // (1,)
  return out;
}

void SemiSync::apply(const std::vector<at::Tensor>& averaged) {
  TITAN_CHECK(averaged.size() == parameters_.size() + 1,
              "[titan::SemiSync] expected {} averaged tensors (one per parameter and the weight), got {}.",
              parameters_.size() + 1, averaged.size());
  const double weight = averaged.back().item<double>();  // sum(weight) / groups
  TITAN_CHECK(weight > 0,
              "[titan::SemiSync] expected at least one replica group to count in the outer step, got a total "
              "weight of {}.",
              weight);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    // sum(weight * x) / groups over sum(weight) / groups: the average of the groups that count. With every group
    // counting the divisor is exactly 1, so this is the plain average bit for bit.
    const at::Tensor x = weight == 1.0 ? averaged[i] : averaged[i] / weight;  // like the parameter
    at::Tensor p = parameters_[i].detach();
    if (options_.method == SemiSyncMethod::local_sgd) {
      p.copy_(x);
      continue;
    }
    // torch.optim.SGD's step, dampening 0: buf = momentum * buf + g; nesterov: d = g + momentum * buf.
    at::Tensor& buf = momentum_[i];
    buf.mul_(options_.outer_momentum).add_(x);
    const at::Tensor d = options_.outer_nesterov ? x.add(buf, options_.outer_momentum) : buf;
    last_sync_[i].add_(d, -options_.outer_lr);
    // torchft's merge: the local parameters (still in p) mixed into the new global ones.
    if (options_.fragment_update_alpha == 0.0) {
      p.copy_(last_sync_[i]);
    } else {
      p.copy_(at::lerp(last_sync_[i], p, options_.fragment_update_alpha));
    }
  }
}

void SemiSync::add_state(checkpoint::State& state, const std::vector<std::string>& names,
                         const dist::Mesh* mesh) const {
  state.values["semi_sync"] = {{"method", options_.method == SemiSyncMethod::diloco ? "diloco" : "local_sgd"},
                               {"sync_steps", options_.sync_steps}};
  for (size_t i = 0; i < last_sync_.size(); ++i) {
    // Sharded like the parameter: the checkpoint reshards it with the model.
    const checkpoint::StateTensor like = checkpoint::state_tensor("", parameters_[i], mesh, /*per_stage=*/true);
    for (const auto& [suffix, tensor] : {std::pair<const char*, const at::Tensor*>{"last_sync", &last_sync_[i]},
                                         std::pair<const char*, const at::Tensor*>{"momentum_buffer", &momentum_[i]}}) {
      checkpoint::StateTensor st = like;
      st.key = fmt::format("semi_sync.{}.{}", names.at(i), suffix);
      st.tensor = *tensor;
      state.tensors.push_back(std::move(st));
    }
  }
}

void synchronize(dist::ReplicaGroup& replicas, SemiSync& outer, const int64_t& step,
                 const std::function<void()>& heal) {
  // A group healed in this outer step holds a copy of the source's parameters: it must not count them twice, in
  // this try or in one after a failure.
  bool healed = false;
  for (int64_t attempt = 1;; ++attempt) {
    healed = replicas.quorum(step).behind() || healed;
    heal();
    std::vector<at::Tensor> averaged = outer.contribution(/*counts=*/!healed);
    replicas.average(averaged);
    if (replicas.commit()) {
      outer.apply(averaged);
      return;
    }
    log::warn(
        "The outer step after step {} did not commit across the replica groups (try {}, one failed): running "
        "it again with the live ones",
        step, attempt);
  }
}

}  // namespace titan
