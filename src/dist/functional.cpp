// SPDX-License-Identifier: BSD-3-Clause
#include "titan/dist/functional.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <functional>
#include <utility>

#include "titan/core/error.hpp"

namespace titan::dist {
namespace {

using torch::autograd::variable_list;

// One-input, one-output backward node running a collective.
struct CollectiveBackward : torch::autograd::Node {
  CollectiveBackward(std::string name, std::function<at::Tensor(const at::Tensor&)> fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    at::NoGradGuard no_grad;
    return {fn_(grads[0])};
  }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  std::function<at::Tensor(const at::Tensor&)> fn_;
};

// output = forward(input) with backward(grad) as its gradient function.
at::Tensor differentiable(const at::Tensor& input, const char* name,
                          const std::function<at::Tensor(const at::Tensor&)>& forward,
                          std::function<at::Tensor(const at::Tensor&)> backward) {
  at::Tensor output;
  {
    at::NoGradGuard no_grad;
    output = forward(input);
  }
  if (c10::GradMode::is_enabled() && input.requires_grad()) {
    auto node = std::shared_ptr<CollectiveBackward>(new CollectiveBackward(name, std::move(backward)),
                                                    torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(input));
    torch::autograd::set_history(output, node);
  }
  return output;
}

int64_t wrap_dim(int64_t dim, const at::Tensor& x) { return dim < 0 ? dim + x.dim() : dim; }

}  // namespace

namespace detail {

at::Tensor gather_along(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  dim = wrap_dim(dim, x);
  const int64_t n = group.size();
  // Gather rank-major on a leading axis, then move it next to dim.
  const at::Tensor input = x.contiguous();
  auto sizes = input.sizes().vec();
  sizes.insert(sizes.begin(), n);
  at::Tensor stacked = at::empty(sizes, input.options());  // (n, *x.shape)
  group.all_gather(stacked, input).wait();
  auto out_sizes = input.sizes().vec();
  out_sizes[static_cast<size_t>(dim)] *= n;
  return stacked.movedim(0, dim).reshape(out_sizes);
}

at::Tensor scatter_sum_along(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  dim = wrap_dim(dim, x);
  const int64_t n = group.size();
  TITAN_CHECK_VALUE(x.size(dim) % n == 0,
                    "[titan::dist::reduce_scatter] expected dim {} of size {} divisible by the group size {} of '{}'.", dim,
                    x.size(dim), n, group.name());
  auto split = x.sizes().vec();
  split[static_cast<size_t>(dim)] /= n;
  split.insert(split.begin() + dim, n);
  const at::Tensor rank_major = x.reshape(split).movedim(dim, 0).contiguous();  // (n, *chunk.shape)
  auto out_sizes = x.sizes().vec();
  out_sizes[static_cast<size_t>(dim)] /= n;
  at::Tensor out = at::empty(out_sizes, x.options());
  group.reduce_scatter(out, rank_major).wait();
  return out;
}

}  // namespace detail

at::Tensor all_gather(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  return differentiable(
      x, "titan::dist::AllGatherBackward", [&](const at::Tensor& t) { return detail::gather_along(t, group, dim); },
      [group, dim](const at::Tensor& g) { return detail::scatter_sum_along(g, group, dim); });
}

at::Tensor reduce_scatter(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  return differentiable(
      x, "titan::dist::ReduceScatterBackward",
      [&](const at::Tensor& t) { return detail::scatter_sum_along(t, group, dim); },
      [group, dim](const at::Tensor& g) { return detail::gather_along(g, group, dim); });
}

at::Tensor all_reduce(const at::Tensor& x, const ProcessGroup& group) {
  return differentiable(
      x, "titan::dist::AllReduceBackward",
      [&](const at::Tensor& t) {
        at::Tensor out = t.contiguous().clone();
        group.all_reduce(out).wait();
        return out;
      },
      [](const at::Tensor& g) { return g; });
}

at::Tensor copy_to_group(const at::Tensor& x, const ProcessGroup& group) {
  return differentiable(
      x, "titan::dist::CopyToGroupBackward", [](const at::Tensor& t) { return t.view_as(t); },
      [group](const at::Tensor& g) {
        at::Tensor out = g.contiguous().clone();
        group.all_reduce(out).wait();
        return out;
      });
}

at::Tensor all_to_all(const at::Tensor& x, const ProcessGroup& group, int64_t split_dim, int64_t cat_dim) {
  auto exchange = [group](const at::Tensor& t, int64_t split, int64_t cat) {
    split = wrap_dim(split, t);
    cat = wrap_dim(cat, t);
    const int64_t n = group.size();
    TITAN_CHECK_VALUE(t.size(split) % n == 0,
                      "[titan::dist::all_to_all] expected dim {} of size {} divisible by the group size {} of '{}'.", split,
                      t.size(split), n, group.name());
    auto sizes = t.sizes().vec();
    sizes[static_cast<size_t>(split)] /= n;
    sizes.insert(sizes.begin() + split, n);
    const at::Tensor send = t.reshape(sizes).movedim(split, 0).contiguous();  // (n, *chunk.shape)
    at::Tensor recv = at::empty_like(send);
    group.all_to_all(recv, send).wait();
    // recv[r] is rank r's chunk: concatenate those along cat.
    auto chunk = recv.sizes().vec();
    chunk.erase(chunk.begin());
    auto out_sizes = chunk;
    out_sizes[static_cast<size_t>(cat)] *= n;
    return recv.movedim(0, cat).reshape(out_sizes);
  };
  return differentiable(
      x, "titan::dist::AllToAllBackward", [&](const at::Tensor& t) { return exchange(t, split_dim, cat_dim); },
      [exchange, split_dim, cat_dim](const at::Tensor& g) { return exchange(g, cat_dim, split_dim); });
}

}  // namespace titan::dist
