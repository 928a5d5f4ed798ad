// SPDX-License-Identifier: BSD-3-Clause
// ShardedParam: a parameter that knows its global shape and its placement on each mesh axis, stores
// only its local shard (the registered parameter's data), and produces the tensor a layer needs this
// step with the reverse collective wired into autograd. It is the C++ counterpart of a DTensor
// parameter. Layers ask for their weights through with_param(); with nothing applied it is a plain
// call, so the same layer code serves one device, FSDP, HSDP, DDP and TP.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "titan/layout/placement.hpp"

namespace titan::dist {
class Mesh;
class ProcessGroup;
}  // namespace titan::dist

namespace titan::parallel {

/// Where this rank's block of a tensor lies in the whole tensor: the one layout description that
/// FSDP, TP, the initialiser, clipping and the checkpoint share.
struct TensorLayout {
  std::vector<int64_t> global_shape{};  ///< shape of the whole (unsharded) tensor
  /// Non-replicated mesh axes in the order they were applied: the first splits the global tensor,
  /// each later one splits the previous one's local block (TP, then FSDP on the TP shard). Every
  /// split is torch.chunk's: ceil-sized chunks, the last ones short or empty (FSDP pads them).
  std::vector<std::pair<std::string, Placement>> placements{};
  std::vector<int64_t> offset{};       ///< where the local region starts in the global tensor
  std::vector<int64_t> local_shape{};  ///< the real (unpadded) extent of the local region (a box)

  /// The layout of a whole, unsharded tensor of `shape`.
  static TensorLayout whole(std::vector<int64_t> shape);
  /// "dp_shard:Shard(0) tp:Shard(1)"; empty for a whole tensor.
  std::string placements_str() const;
};

/// What every sharding-aware part needs to know about one parameter: its layout, name and storage.
struct ShardedParam : TensorLayout {
  std::string fqn;   ///< model path, e.g. layers.0.attention.wq.weight
  at::Tensor local;  ///< the registered parameter (dim 0 may be padded)
  /// "layers.0.attention.wq.weight (4096, 4096) Shard(0) on dp_shard"
  std::string str() const;
};

/// The sharding of p, or nullptr when p is an ordinary (whole, local) tensor.
const ShardedParam* sharded_param(const at::Tensor& p);

/// Elements of the whole tensor behind p (its global shape when sharded): a count that does not depend on whether
/// it is asked before or after parallelize.
int64_t global_numel(const at::Tensor& p);

/// The whole tensor behind p (DTensor.full_tensor()): all-gathered over every axis p is sharded on,
/// padding dropped. Collective over those axes of mesh; a copy of p when p is not sharded.
at::Tensor full_tensor(const at::Tensor& p, const dist::Mesh& mesh);

/// A parameter its data-parallel handler all-gathered in float8 for this use (FSDP's float8
/// all-gather, docs/float8.md): the float8 bytes of the whole (unsharded) tensor and their tensorwise
/// scale, x ~= data / scale.
struct GatheredFloat8 {
  at::Tensor data{};   ///< the unsharded shape, float8
  at::Tensor scale{};  ///< () float32
};

/// What a layer's matmul may need besides x and w under a parallel layout (both null on one device):
/// handed to it explicitly, never through ambient state.
struct WeightUse {
  /// w as FSDP all-gathered it in float8 (w itself then carries autograd's edge to the shard but no values).
  const GatheredFloat8* float8 = nullptr;
  /// The tensor-parallel group w is sharded over: a float8 layer's tensorwise scales span its shards.
  const dist::ProcessGroup* tp_group = nullptr;
};

namespace detail {
struct Binding;
extern std::atomic<int64_t> bound_params;
/// What a handler hands a layer for one use of a parameter.
struct Materialized {
  at::Tensor tensor{};                     ///< what the layer computes with
  std::optional<GatheredFloat8> float8{};  ///< the float8 form, when the handler gathered it in float8
};
const Binding* find_binding(const at::Tensor& p);
Materialized materialize(const Binding& binding);
at::Tensor after_use(const Binding& binding, const at::Tensor& output);

template <class F>
at::Tensor call_with(F& f, const at::Tensor& w, const GatheredFloat8* float8) {
  if constexpr (std::is_invocable_v<F&, const at::Tensor&, const GatheredFloat8*>)
    return f(w, float8);
  else
    return f(w);
}
}  // namespace detail

/// Calls f with the tensor the layer needs for p this step (e.g. the all-gathered weight under
/// FSDP) and returns f's result, wired so that p's gradient reaches its shard. f takes (w) or
/// (w, const GatheredFloat8*): the second form also gets p's float8 form when FSDP gathered it so.
template <class F>
at::Tensor with_param(const at::Tensor& p, F&& f) {
  if (detail::bound_params.load(std::memory_order_relaxed) == 0) return detail::call_with(f, p, nullptr);
  const detail::Binding* binding = detail::find_binding(p);
  if (binding == nullptr) return detail::call_with(f, p, nullptr);
  const detail::Materialized used = detail::materialize(*binding);
  return detail::after_use(*binding, detail::call_with(f, used.tensor, used.float8 ? &*used.float8 : nullptr));
}

}  // namespace titan::parallel
