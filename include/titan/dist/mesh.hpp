// SPDX-License-Identifier: BSD-3-Clause
// The device mesh: world ranks laid out on named axes pp x dp_replicate x dp_shard x cp x tp
// (torchtitan's order, tp fastest), with a process group per axis and per flattened axis set
// (dp = dp_replicate x dp_shard, dp_shard_cp, dp_cp). "Axis" is a mesh axis, "dim" a tensor dim.
// Expert parallelism borrows its axis from dp_shard x cp as torchtitan does: dp_shard_cp unflattened
// into (efsdp, ep), ep fastest; the groups "ep" and "efsdp" exist on every mesh (size 1 without EP).
// Expert tensor parallelism (etp) is 1 or tp: the group "etp" is then the tp group, or this rank alone.
// A planning mesh (Mesh::virtual_mesh) has the same groups with sizes and ranks but no process group behind
// them: titan::parallelize applies a plan over it to a model on the meta device, as titan-plan does.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "titan/dist/process_group.hpp"
#include "titan/dist/store.hpp"

namespace titan {
struct ParallelismConfig;
}

namespace titan::dist {

/// Degrees of the mesh axes; their product is the world size.
struct MeshShape {
  int64_t pp = 1;            ///< pipeline stages
  int64_t dp_replicate = 1;  ///< replicated data parallel (DDP, or the replicate axis of HSDP)
  int64_t dp_shard = 1;      ///< sharded data parallel (FSDP)
  int64_t cp = 1;            ///< context parallel
  int64_t tp = 1;            ///< tensor parallel
  int64_t ep = 1;            ///< expert parallel: borrowed from dp_shard x cp (divides it), not a factor of the world
  int64_t etp = 1;           ///< expert tensor parallel: 1 (experts whole over tp) or tp (split over it), not a factor

  int64_t world_size() const { return pp * dp_replicate * dp_shard * cp * tp; }
  /// Data-parallel degree: how many different batches one step sees.
  int64_t dp() const { return dp_replicate * dp_shard; }
  /// FSDP degree of the expert weights (torchtitan's efsdp): dp_shard x cp left over by ep.
  int64_t efsdp() const { return dp_shard * cp / ep; }
};
/// fmt: "dp_replicate(2) * dp_shard(4) * cp(1) * tp(2) * pp(1) = 16".
std::string format_as(const MeshShape& shape);

/// Resolves parallelism.* degrees for world_size ranks (data_parallel_shard_degree -1 takes what is
/// left) and checks that they multiply to it, naming every factor when they don't.
MeshShape mesh_shape(const ParallelismConfig& parallelism, int64_t world_size);

/// How to build the groups.
struct MeshOptions {
  /// "gloo" (CPU), "nccl" (CUDA) or "strict" (Gloo with NCCL's rules enforced: tests on CPU).
  std::string backend = "gloo";
  /// Rendezvous timeout (comm.init_timeout_seconds).
  std::chrono::milliseconds init_timeout{std::chrono::seconds(300)};
  /// Collective timeout (comm.train_timeout_seconds).
  std::chrono::milliseconds timeout{std::chrono::seconds(100)};
};

/// This rank's view of the mesh. Copies share the groups.
class Mesh {
 public:
  /// The mesh of a single process (every group has one rank).
  Mesh();
  /// Builds every group this rank belongs to, in the same order on every rank. Collective: all
  /// world ranks must call it with the same shape and a store they share.
  Mesh(const MeshShape& shape, int64_t rank, const Store& store, const MeshOptions& options = {});

  /// Rank `rank`'s view of a mesh of `shape` with no process group: every group reports its size, this rank's
  /// place and its members as a real mesh's would, and refuses any collective or point-to-point call with an
  /// error naming it. For planning: titan::parallelize over it shards a model built on the meta device (nothing is
  /// allocated, nobody is met) exactly as over the real mesh. Errors name the factor for a bad shape or rank.
  static Mesh virtual_mesh(const MeshShape& shape, int64_t rank);
  /// The mesh of this process as the launcher (titan-run, torchrun, srun) describes it: reads the
  /// launch environment, meets the other ranks at MASTER_ADDR:MASTER_PORT and builds the groups.
  /// One process: the single-rank mesh. shape must multiply to WORLD_SIZE (errors name each factor).
  static Mesh from_launch_env(const MeshShape& shape, const MeshOptions& options = {});
  /// The same with the degrees of parallelism.* (data_parallel_shard_degree -1 takes what is left).
  static Mesh from_launch_env(const ParallelismConfig& parallelism, const MeshOptions& options = {});

  const MeshShape& shape() const { return shape_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return shape_.world_size(); }
  /// Degree of an axis or flattened axis set ("tp", "dp", "dp_shard_cp", ...).
  int64_t size(std::string_view axis) const { return group(axis).size(); }
  /// This rank's index along an axis or flattened axis set.
  int64_t coordinate(std::string_view axis) const { return group(axis).rank(); }
  /// The group of ranks that differ from this one only along `axis` (also "ep", "efsdp", "etp").
  const ProcessGroup& group(std::string_view axis) const;

  /// Axis and flattened-axis names, in creation order.
  static const std::array<std::string_view, 9>& axis_names();
  /// The base axes (pp, dp_replicate, dp_shard, cp, tp) that an axis or flattened axis set spans, in
  /// mesh order: "dp" -> {dp_replicate, dp_shard}, "tp" -> {tp}. Throws for a name not in axis_names().
  static std::vector<std::string_view> base_axes(std::string_view axis);

 private:
  MeshShape shape_;
  int64_t rank_ = 0;
  std::map<std::string, ProcessGroup, std::less<>> groups_;
};

}  // namespace titan::dist
