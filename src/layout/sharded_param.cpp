// SPDX-License-Identifier: BSD-3-Clause
#include "titan/layout/sharded_param.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>

#include "attachments.hpp"
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

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
Attachments<c10::TensorImpl, WeakImpl, Binding>& bindings() {
  static Attachments<c10::TensorImpl, WeakImpl, Binding> index(bound_params);
  return index;
}

Binding* attach(const at::Tensor& p, Binding binding) {
  return bindings().attach(p.unsafeGetTensorImpl(), WeakImpl(p.getIntrusivePtr()),
                           std::make_shared<Binding>(std::move(binding)));
}
}  // namespace

void bind_param(const at::Tensor& p, Binding binding) { attach(p, std::move(binding)); }

void orphan_param(const at::Tensor& p, std::string why) {
  Binding tombstone;
  tombstone.orphaned = std::move(why);
  attach(p, std::move(tombstone));
}

void unbind_param(const at::Tensor& p) { bindings().detach(p.unsafeGetTensorImpl()); }

void attach_contract(const at::Tensor& p, std::shared_ptr<Contract> contract) {
  Binding* binding = bindings().find(p.unsafeGetTensorImpl());
  TORCH_INTERNAL_ASSERT(binding != nullptr, "attach_contract: the parameter is not bound");
  binding->contract = std::move(contract);
}

const Binding* find_binding(const at::Tensor& p) { return bindings().find(p.unsafeGetTensorImpl()); }

Materialized materialize(const Binding& binding) {
  TORCH_CHECK(binding.orphaned.empty(), binding.orphaned);
  binding.used.value.store(true, std::memory_order_relaxed);
  Materialized m = binding.handler ? binding.handler->materialize(binding.unit, binding.index)
                                   : Materialized{.tensor = binding.info.local};
  if (binding.transform) m.tensor = binding.transform(m.tensor);
  if (binding.contract && c10::GradMode::is_enabled() && !binding.contract->armed.exchange(true)) {
    m.tensor = contract_probe(m.tensor, binding.contract);
  }
  return m;
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

const ShardedParam* sharded_param(const at::Tensor& p) {
  if (detail::bound_params.load(std::memory_order_relaxed) == 0) return nullptr;
  const detail::Binding* binding = detail::find_binding(p);
  return binding && binding->orphaned.empty() ? &binding->info : nullptr;
}

int64_t global_numel(const at::Tensor& p) {
  const ShardedParam* sharded = sharded_param(p);
  if (sharded == nullptr) return p.numel();
  int64_t n = 1;
  for (const int64_t d : sharded->global_shape) n *= d;
  return n;
}

}  // namespace titan::parallel
