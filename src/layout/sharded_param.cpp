// SPDX-License-Identifier: BSD-3-Clause
#include "titan/layout/sharded_param.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <shared_mutex>
#include <unordered_map>

#include "binding.hpp"
#include "titan/dist/functional.hpp"
#include "titan/dist/mesh.hpp"

namespace titan::parallel {
namespace detail {

std::atomic<int64_t> bound_params{0};

namespace {
// Ranks as threads each bind their own parameters, so the map is shared and locked; lookups take a
// shared lock (a few ns per layer call).
struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<const c10::TensorImpl*, std::unique_ptr<Binding>> bindings;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void bind_param(const at::Tensor& p, Binding binding) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  auto [it, inserted] = r.bindings.insert_or_assign(p.unsafeGetTensorImpl(), std::make_unique<Binding>(std::move(binding)));
  if (inserted) ++bound_params;
}

void unbind_param(const at::Tensor& p) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (r.bindings.erase(p.unsafeGetTensorImpl()) > 0) --bound_params;
}

const Binding* find_binding(const at::Tensor& p) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  auto it = r.bindings.find(p.unsafeGetTensorImpl());
  return it == r.bindings.end() ? nullptr : it->second.get();
}

at::Tensor materialize(const Binding& binding) {
  at::Tensor t = binding.handler ? binding.handler->materialize(binding.unit, binding.index) : binding.info.local;
  return binding.transform ? binding.transform(t) : t;
}

at::Tensor after_use(const Binding& binding, const at::Tensor& output) {
  return binding.handler ? binding.handler->after_use(binding.unit, output) : output;
}

}  // namespace detail

std::string Placement::str() const {
  switch (kind) {
    case Kind::kShard:
      return fmt::format("Shard({})", dim);
    case Kind::kPartial:
      return "Partial()";
    default:
      return "Replicate()";
  }
}

std::string ShardedParam::str() const {
  std::string where;
  for (const auto& [axis, placement] : placements) where += fmt::format(" {} on {}", placement.str(), axis);
  return fmt::format("{} ({}){}", fqn, fmt::join(global_shape, ", "), where.empty() ? " Replicate()" : where);
}

at::Tensor full_tensor(const at::Tensor& p, const dist::Mesh& mesh) {
  at::NoGradGuard no_grad;
  const ShardedParam* sp = sharded_param(p);
  if (sp == nullptr || sp->placements.empty()) return p.detach().clone();
  // The block shape after each split (ceil chunks, as sharding made them), then undo the splits
  // last-first: gather along the split dim and drop that level's padding.
  std::vector<std::vector<int64_t>> shapes{sp->global_shape};
  for (const auto& [axis, placement] : sp->placements) {
    std::vector<int64_t> shape = shapes.back();
    if (placement.kind == Placement::Kind::kShard) {
      const int64_t n = mesh.size(axis);
      auto& extent = shape[static_cast<size_t>(placement.dim)];
      extent = (extent + n - 1) / n;
    }
    shapes.push_back(std::move(shape));
  }
  at::Tensor t = p.detach();
  for (size_t i = sp->placements.size(); i-- > 0;) {
    const auto& [axis, placement] = sp->placements[i];
    if (placement.kind != Placement::Kind::kShard) continue;
    t = dist::detail::gather_along(t, mesh.group(axis), placement.dim).narrow(placement.dim, 0, shapes[i][static_cast<size_t>(placement.dim)]);
  }
  return t.contiguous();
}

const ShardedParam* sharded_param(const at::Tensor& p) {
  if (detail::bound_params.load(std::memory_order_relaxed) == 0) return nullptr;
  const detail::Binding* binding = detail::find_binding(p);
  return binding ? &binding->info : nullptr;
}

}  // namespace titan::parallel
