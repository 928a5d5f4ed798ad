// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/clip.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>

#include "titan/dist/mesh.hpp"
#include "titan/layout/sharded_param.hpp"

namespace titan {
namespace {

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

// The mesh axes a parameter is sharded on ("" for whole parameters).
std::string sharded_axes(const at::Tensor& p) {
  std::string axes;
  if (const parallel::ShardedParam* sp = parallel::sharded_param(p)) {
    for (const auto& [axis, placement] : sp->placements) {
      if (placement.kind == parallel::Placement::Kind::kShard) axes += axis + ",";
    }
  }
  return axes;
}

}  // namespace

at::Tensor grad_norm(const std::vector<at::Tensor>& params, const dist::Mesh* mesh) {
  at::NoGradGuard no_grad;
  // Squared norms grouped by the axes their parameters are sharded on; each group is summed over
  // its axes one after the other (a sum over a product of axes).
  std::map<std::string, std::vector<at::Tensor>> by_axes;
  for (const auto& p : params) {
    if (p.grad().defined()) by_axes[mesh ? sharded_axes(p) : std::string()].push_back(p.grad());
  }
  at::Tensor total;
  for (auto& [axes, grads] : by_axes) {
    at::Tensor sq = at::stack(at::_foreach_norm(grads, 2)).to(at::kFloat).square().sum();  // ()
    for (size_t begin = 0; begin < axes.size();) {
      const size_t comma = axes.find(',', begin);
      at::Tensor reduced = sq.reshape({1}).to(at::kFloat).contiguous();
      mesh->group(axes.substr(begin, comma - begin)).all_reduce(reduced).wait();
      sq = reduced.reshape({});
      begin = comma + 1;
    }
    total = total.defined() ? total + sq.to(total.device()) : sq;
  }
  if (mesh && mesh->size("pp") > 1) {
    // Each pp rank holds other stages' parameters (possibly none of some kind): one sum over pp of
    // every rank's stage total.
    at::Tensor reduced = (total.defined() ? total : at::zeros({}, at::kFloat)).reshape({1}).to(at::kFloat).contiguous();
    mesh->group("pp").all_reduce(reduced).wait();
    total = reduced.reshape({});
  }
  return total.defined() ? total.sqrt() : at::zeros({}, at::kFloat);
}

double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm, const dist::Mesh* mesh,
                       const std::vector<at::Tensor>& copies) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> counted;
  for (const auto& p : params) {
    const bool copy = std::any_of(copies.begin(), copies.end(), [&](const at::Tensor& c) { return c.is_same(p); });
    if (!copy) counted.push_back(p);
  }
  const double total = grad_norm(counted, mesh).item<double>();
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
      auto grads = defined_grads(params);
      at::_foreach_mul_(grads, coef);
    }
  }
  return total;
}

}  // namespace titan
