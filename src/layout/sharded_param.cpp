// SPDX-License-Identifier: BSD-3-Clause
#include "titan/layout/sharded_param.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

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
// An identity whose backward tells the contract that a backward pass reached its parameters.
// The graph may outlive the handle: the probe holds its contract weakly.
struct ContractRef : torch::CustomClassHolder {
  std::weak_ptr<Contract> contract;
};

struct ContractProbe : torch::autograd::Function<ContractProbe> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::shared_ptr<Contract>& contract) {
    auto ref = c10::make_intrusive<ContractRef>();
    ref->contract = contract;
    ctx->saved_data["contract"] = c10::IValue::make_capsule(std::move(ref));
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<ContractRef>(ctx->saved_data["contract"].toCapsule());
    if (auto contract = ref->contract.lock()) contract->on_backward();
    return {grads[0], at::Tensor()};
  }
};

at::Tensor contract_probe(const at::Tensor& x, const std::shared_ptr<Contract>& contract) {
  return ContractProbe::apply(x, contract);
}

// The float8 form a handler offered for the tensor it just materialised (ranks as threads: one slot
// per thread, and a layer uses its weight on the thread that materialised it).
struct Float8Offer {
  const c10::TensorImpl* carrier = nullptr;  // what with_param hands the layer
  GatheredFloat8 f8{};
};
thread_local Float8Offer float8_offer;

// Ranks as threads each bind their own parameters, so the map is shared and locked; lookups take a
// shared lock (a few ns per layer call).
struct Entry {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> owner;  // pins the address, not the data
  std::unique_ptr<Binding> binding;
};
struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<const c10::TensorImpl*, Entry> bindings;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void bind_param(const at::Tensor& p, Binding binding) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  auto [it, inserted] = r.bindings.insert_or_assign(
      p.unsafeGetTensorImpl(),
      Entry{.owner = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(p.getIntrusivePtr()),
            .binding = std::make_unique<Binding>(std::move(binding))});
  if (inserted) ++bound_params;
}

void orphan_param(const at::Tensor& p, std::string why) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  std::erase_if(r.bindings, [](const auto& item) {
    if (!item.second.owner.expired()) return false;
    --bound_params;
    return true;
  });
  auto binding = std::make_unique<Binding>();
  binding->orphaned = std::move(why);
  auto [it, inserted] = r.bindings.insert_or_assign(
      p.unsafeGetTensorImpl(),
      Entry{.owner = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(p.getIntrusivePtr()),
            .binding = std::move(binding)});
  if (inserted) ++bound_params;
}

void unbind_param(const at::Tensor& p) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (r.bindings.erase(p.unsafeGetTensorImpl()) > 0) --bound_params;
}

void attach_contract(const at::Tensor& p, std::shared_ptr<Contract> contract) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  auto it = r.bindings.find(p.unsafeGetTensorImpl());
  TORCH_INTERNAL_ASSERT(it != r.bindings.end(), "attach_contract: the parameter is not bound");
  it->second.binding->contract = std::move(contract);
}

const Binding* find_binding(const at::Tensor& p) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  auto it = r.bindings.find(p.unsafeGetTensorImpl());
  return it == r.bindings.end() ? nullptr : it->second.binding.get();
}

at::Tensor materialize(const Binding& binding) {
  TORCH_CHECK(binding.orphaned.empty(), binding.orphaned);
  float8_offer = {};
  binding.used.value.store(true, std::memory_order_relaxed);
  at::Tensor t = binding.handler ? binding.handler->materialize(binding.unit, binding.index) : binding.info.local;
  if (binding.transform) t = binding.transform(t);
  if (binding.contract && c10::GradMode::is_enabled() && !binding.contract->armed.exchange(true)) {
    t = contract_probe(t, binding.contract);
  }
  if (float8_offer.carrier != nullptr) float8_offer.carrier = t.unsafeGetTensorImpl();  // after the wrappers
  return t;
}

void offer_gathered_float8(const at::Tensor& carrier, GatheredFloat8 f8) {
  float8_offer = {.carrier = carrier.unsafeGetTensorImpl(), .f8 = std::move(f8)};
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

TensorLayout TensorLayout::whole(std::vector<int64_t> shape) {
  TensorLayout layout{.global_shape = shape, .offset = std::vector<int64_t>(shape.size(), 0)};
  layout.local_shape = std::move(shape);
  return layout;
}

std::string TensorLayout::placements_str() const {
  std::string out;
  for (const auto& [axis, placement] : placements) {
    if (placement.kind == Placement::Kind::kReplicate) continue;
    if (!out.empty()) out += ' ';
    out += fmt::format("{}:{}", axis, placement.str());
  }
  return out;
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
    t = dist::detail::gather_along(t, mesh.group(axis), placement.dim)
            .narrow(placement.dim, 0, shapes[i][static_cast<size_t>(placement.dim)]);
  }
  return t.contiguous();
}

std::optional<GatheredFloat8> take_gathered_float8(const at::Tensor& w) {
  detail::Float8Offer& offer = detail::float8_offer;
  if (offer.carrier == nullptr || offer.carrier != w.unsafeGetTensorImpl()) return std::nullopt;
  GatheredFloat8 f8 = std::move(offer.f8);
  offer = {};
  return f8;
}

const ShardedParam* sharded_param(const at::Tensor& p) {
  if (detail::bound_params.load(std::memory_order_relaxed) == 0) return nullptr;
  const detail::Binding* binding = detail::find_binding(p);
  return binding && binding->orphaned.empty() ? &binding->info : nullptr;
}

}  // namespace titan::parallel
