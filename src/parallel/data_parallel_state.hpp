// SPDX-License-Identifier: BSD-3-Clause
// Private: the per-rank state machine behind titan::parallel::DataParallel.
//
// A unit's life in one step (FSDP, reshard_after_forward):
//   forward : first use -> wait its all-gather (issued early as a prefetch) -> issue the next unit's
//             all-gather -> layers compute -> next unit's first use frees this unit's gathered storage
//   backward: first layer output of the unit reached -> re-gather (and prefetch the unit before) ->
//             layers' backward -> the unit's gather node receives all its gradients -> reduce-scatter
//             issued async, gathered storage freed -> end of backward: wait, write shard .grad
// The gathered tensors that autograd saved keep their StorageImpl; only its bytes are released and
// re-attached, so saved tensors see the re-gathered data without a version bump.
#pragma once

#include <c10/core/StorageImpl.h>

#include <optional>
#include <string>
#include <vector>

#include "../layout/binding.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/parallel/data_parallel.hpp"

namespace titan::parallel::detail {

struct UnitParam {
  at::Tensor param;                               // the registered leaf; data (rows_per_rank, ...) = local shard
  std::vector<int64_t> full_shape;                // the unsharded shape
  int64_t rows_per_rank = 0;                      // dim-0 rows of every shard (last ranks zero-padded)
  int64_t row_numel = 1;                          // elements per dim-0 row
  int64_t offset = 0;                             // element offset in the unit's per-rank flat chunk
  c10::intrusive_ptr<c10::StorageImpl> gathered;  // the unsharded tensor's storage (FSDP); bytes freed when sharded
  // float8 all-gather (options.float8_all_gather): the shard cast to e4m3 with the whole tensor's scale
  // travels instead of the high-precision shard, and layers get the gathered float8 bytes + scale.
  bool float8 = false;
  c10::intrusive_ptr<c10::StorageImpl> gathered8;  // the unsharded float8 bytes' storage; freed when sharded
  at::Tensor float8_scale{};                       // () float32, the scale of the bytes gathered last
  std::vector<at::Tensor> float8_buffers{};  // in flight: {in (rows_per_rank, ...), out (N * rows_per_rank, ...)} bytes
  int64_t shard_numel() const { return rows_per_rank * row_numel; }
  // The unsharded shape with dim 0 rounded up to n equal shards: what the collectives move.
  std::vector<int64_t> padded_shape(int64_t n) const {
    std::vector<int64_t> shape = full_shape;
    shape[0] = n * rows_per_rank;
    return shape;
  }
};

struct Unit {
  enum class State { kSharded, kGathering, kGathered };
  std::string name;
  std::vector<UnitParam> params{};
  int64_t chunk_numel = 0;  // per-rank elements of the flat all-gather input
  bool reshard_after_forward = true;
  State state = State::kSharded;
  std::vector<dist::Work> gather_works{};
  // What the in-flight all-gathers read and write. Flat: {in (chunk_numel), out (N * chunk_numel)};
  // per parameter: each input, and the (N * rows_per_rank, ...) landing buffer of a padded one.
  std::vector<at::Tensor> gather_buffers{};
  std::vector<at::Tensor> outputs{};  // this forward's gathered tensors with autograd history
};

// A unit's gradient on its way: reduce-scatter over dp_shard, then all-reduce over dp_replicate.
// Flat: one in (shard_size, chunk_numel) and one out (chunk_numel); per parameter: one pair each,
// in (shard_size * rows_per_rank, ...) and out (rows_per_rank, ...). All in reduce_dtype.
struct PendingReduce {
  int64_t unit = 0;
  std::vector<at::Tensor> in{};
  std::vector<at::Tensor> out{};
  std::vector<dist::Work> works{};
  int stage = 0;  // 0: reduce-scatter in flight, 1: all-reduce in flight, 2: reduced, 3: written to .grad
};

struct DataParallelState final : ParamHandler {
  DataParallelState(dist::ProcessGroup shard_group, dist::ProcessGroup replicate_group, DataParallelOptions opts,
                    bool per_param_collectives);
  ~DataParallelState() override;

  Materialized materialize(int64_t unit, int64_t index) override;
  at::Tensor after_use(int64_t unit, const at::Tensor& output) override;

  void pre_backward(int64_t unit);
  void post_backward(int64_t unit, const std::vector<at::Tensor>& grads);
  /// Reduces the gradients accumulated while gradient_sync was off and writes the shards' .grad.
  void sync_gradients();
  void finish_backward();
  void free_all();
  int64_t gathered_bytes() const;
  /// See DataParallel::precompute_float8_scales.
  void precompute_float8_scales();

  dist::ProcessGroup shard;
  std::string shard_axis = "dp_shard";  // its mesh axis: dp_shard, or dp_shard_cp under context parallelism
  dist::ProcessGroup replicate;
  DataParallelOptions options;
  // One collective per parameter, straight between its storage and the gathered/reduced tensors (CPU):
  // no flat-buffer copies. Else one flat collective per unit (GPU: fewest launches).
  bool per_param;
  std::vector<Unit> units;
  std::vector<DataParallelEvent> events;
  // Off: each backward adds the unit's unsharded gradients to `deferred` and nothing is reduced
  // until sync_gradients() (FSDP2's set_requires_gradient_sync(False); the pipeline's microbatches).
  bool gradient_sync = true;
  std::vector<std::vector<at::Tensor>> deferred;  // per unit, per parameter: the full gradient (reduce_dtype)
  // Where a float8 parameter's amax is reduced besides dp_shard: tp when parameters are TP shards too.
  std::optional<dist::ProcessGroup> float8_tp;
  // options.float8_precompute_scales: set when a forward starts, cleared by precompute_float8_scales.
  bool float8_scales_stale = true;

 private:
  void enter_unit(int64_t unit);
  void start_gather(int64_t unit);
  void start_gather_flat(Unit& unit);
  void start_gather_per_param(Unit& unit);
  void finish_gather(int64_t unit);
  void allocate_gathered(UnitParam& p) const;
  PendingReduce start_reduce_flat(int64_t unit, const std::vector<at::Tensor>& grads);
  PendingReduce start_reduce_per_param(int64_t unit, const std::vector<at::Tensor>& grads);
  at::Tensor padded_grad(const UnitParam& p, const at::Tensor& grad) const;
  void free_unit(int64_t unit);
  at::Tensor gathered_alias(const UnitParam& p) const;
  // float8 all-gather (data_parallel_float8.cpp).
  void start_gather_float8(Unit& unit, UnitParam& p);
  void finish_gather_float8(UnitParam& p);
  at::Tensor gathered_float8_alias(const UnitParam& p) const;
  at::Tensor float8_carrier(const UnitParam& p) const;
  std::vector<dist::ProcessGroup> float8_amax_groups() const;
  void progress(PendingReduce& p, bool block);
  void record(DataParallelEvent::Kind kind, int64_t unit);

  int64_t current_ = -1;
  bool callback_queued_ = false;
  std::vector<PendingReduce> pending_;
};

/// The state behind an applied DataParallel, for parallelize() to wire it to the pipeline.
inline DataParallelState& mutable_state(DataParallel& dp) { return const_cast<DataParallelState&>(dp.state()); }

}  // namespace titan::parallel::detail
