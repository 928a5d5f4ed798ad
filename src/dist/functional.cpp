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

// x split into group.size() chunks along dim, stacked rank-major: (n, *chunk.shape), contiguous.
at::Tensor split_rank_major(const at::Tensor& x, const ProcessGroup& group, int64_t dim, const char* op) {
  const int64_t n = group.size();
  TITAN_CHECK_VALUE(x.size(dim) % n == 0,
                    "[titan::dist::{}] expected dim {} of size {} divisible by the group size {} "
                    "of '{}'.",
                    op, dim, x.size(dim), n, group.name());
  auto split = x.sizes().vec();
  split[static_cast<size_t>(dim)] /= n;
  split.insert(split.begin() + dim, n);
  return x.reshape(split).movedim(dim, 0).contiguous();
}

// A collective in flight: both buffers must outlive it.
struct InFlight {
  at::Tensor out;
  at::Tensor in;
  Work work;
};

// Gathers rank-major on a leading axis: (n, *x.shape); gathered_view moves it next to dim.
InFlight gather_rank_major(const at::Tensor& x, const ProcessGroup& group) {
  const at::Tensor input = x.contiguous();
  auto sizes = input.sizes().vec();
  sizes.insert(sizes.begin(), group.size());
  at::Tensor stacked = at::empty(sizes, input.options());  // (n, *x.shape)
  Work work = group.all_gather(stacked, input);
  return {stacked, input, std::move(work)};
}

at::Tensor gathered_view(const at::Tensor& stacked, int64_t dim) {
  auto out_sizes = stacked.sizes().vec();
  const int64_t n = out_sizes.front();
  out_sizes.erase(out_sizes.begin());
  out_sizes[static_cast<size_t>(dim)] *= n;
  return stacked.movedim(0, dim).reshape(out_sizes);
}

InFlight scatter_sum_start(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  const at::Tensor rank_major = split_rank_major(x, group, dim, "reduce_scatter");  // (n, *chunk.shape)
  auto out_sizes = x.sizes().vec();
  out_sizes[static_cast<size_t>(dim)] /= group.size();
  at::Tensor out = at::empty(out_sizes, x.options());
  Work work = group.reduce_scatter(out, rank_major);
  return {out, rank_major, std::move(work)};
}

}  // namespace

namespace detail {

at::Tensor gather_along(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  dim = wrap_dim(dim, x);
  InFlight g = gather_rank_major(x, group);
  g.work.wait();
  return gathered_view(g.out, dim);
}

at::Tensor scatter_sum_along(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  InFlight r = scatter_sum_start(x, group, wrap_dim(dim, x));
  r.work.wait();
  return r.out;
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
      x, "titan::dist::CopyToGroupBackward",
      // An alias that is not an autograd view of x, so it can take its own grad_fn.
      [](const at::Tensor& t) { return at::empty({0}, t.options()).set_(t); },
      [group](const at::Tensor& g) {
        at::Tensor out = g.contiguous().clone();
        group.all_reduce(out).wait();
        return out;
      });
}

PendingCollective PendingCollective::start(bool gather, const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  PendingCollective p;
  p.gather = gather;
  p.input = x;
  p.group = group;
  p.dim = wrap_dim(dim, x);
  InFlight f = gather ? gather_rank_major(x.detach(), group) : scatter_sum_start(x.detach(), group, p.dim);
  p.buffer = f.out;
  p.source = f.in;
  p.work = std::move(f.work);
  return p;
}

PendingCollective all_gather_start(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  return PendingCollective::start(/*gather=*/true, x, group, dim);
}

PendingCollective reduce_scatter_start(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  return PendingCollective::start(/*gather=*/false, x, group, dim);
}

at::Tensor PendingCollective::finish() {
  work.wait();
  source.reset();
  const at::Tensor result = gather ? gathered_view(buffer, dim) : buffer;
  auto backward = gather ? std::function<at::Tensor(const at::Tensor&)>([g = group, d = dim](const at::Tensor& grad) {
    return detail::scatter_sum_along(grad, g, d);
  })
                         : [g = group, d = dim](const at::Tensor& grad) { return detail::gather_along(grad, g, d); };
  return differentiable(
      input, gather ? "titan::dist::AllGatherBackward" : "titan::dist::ReduceScatterBackward",
      [&](const at::Tensor&) { return result; }, std::move(backward));
}

namespace {
at::Tensor local_chunk(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  dim = wrap_dim(dim, x);
  TITAN_CHECK_VALUE(x.size(dim) % group.size() == 0,
                    "[titan::dist::split_to_shard] expected dim {} of size {} divisible "
                    "by the group size {} of '{}'.",
                    dim, x.size(dim), group.size(), group.name());
  const int64_t chunk = x.size(dim) / group.size();
  return x.narrow(dim, group.rank() * chunk, chunk).contiguous();
}
}  // namespace

at::Tensor gather_to_replicate(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  return differentiable(
      x, "titan::dist::GatherToReplicateBackward",
      [&](const at::Tensor& t) { return detail::gather_along(t, group, dim); },
      [group, dim](const at::Tensor& g) { return local_chunk(g, group, dim); });
}

at::Tensor split_to_shard(const at::Tensor& x, const ProcessGroup& group, int64_t dim) {
  return differentiable(
      x, "titan::dist::SplitToShardBackward", [&](const at::Tensor& t) { return local_chunk(t, group, dim); },
      [group, dim](const at::Tensor& g) { return detail::gather_along(g, group, dim); });
}

at::Tensor all_to_all(const at::Tensor& x, const ProcessGroup& group, int64_t split_dim, int64_t cat_dim) {
  auto exchange = [group](const at::Tensor& t, int64_t split, int64_t cat) {
    cat = wrap_dim(cat, t);
    const int64_t n = group.size();
    const at::Tensor send = split_rank_major(t, group, wrap_dim(split, t), "all_to_all");  // (n, *chunk.shape)
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
