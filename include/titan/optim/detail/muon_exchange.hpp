// SPDX-License-Identifier: BSD-3-Clause
// How Muon orthogonalises sharded matrices whole: each matrix's update travels to one owner rank and back, axis by
// axis. A matrix sharded on axes a_0 .. a_{m-1} (the order they were applied: TP, then FSDP on the TP shard) is
// gathered over a_{m-1} first (to the owner's coordinate on it), then over a_{m-2} by the ranks that now hold a
// gathered block, and so on until the owner holds it whole; the update is scattered back in the reverse order. One
// round handles level m-1-r of every matrix: one all-to-all per axis that has blocks to move, the step's matrices
// batched in it, issued by every member of the axis' group alike (a group whose members have nothing to move skips
// it, and all of them know it). Blocks keep their nominal (ceil-chunk) shape on every level, padding at the end, as
// layout/sharded_param.hpp's full_tensor gathers them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace titan::dist {
class Mesh;
}

namespace titan::detail {

/// One mesh axis a matrix is split over.
struct MuonLevel {
  std::string axis{};  ///< the mesh axis ("tp", "dp_shard", "dp_shard_cp")
  int64_t dim = 0;     ///< the matrix dim it splits
  int64_t size = 1;    ///< its degree
  int64_t owner = 0;   ///< the owner's coordinate on it
};

/// A matrix's way to its owner.
struct MuonRoute {
  std::vector<MuonLevel> levels{};  ///< the sharded axes, in the order they were applied (empty: whole here)
  /// shapes[j]: the block level j splits (shapes[0] the whole matrix); shapes.back(): the local block.
  std::vector<std::vector<int64_t>> shapes{};
};

class MuonExchange {
 public:
  /// Routes each of `matrices` (the local tensors, ShardedParams or whole; `names` for errors): owners round-robin
  /// over the ranks sharing a matrix, largest matrix first. A sharded matrix needs `mesh`.
  MuonExchange(const std::vector<at::Tensor>& matrices, const std::vector<std::string>& names, const dist::Mesh* mesh);

  /// The orthogonalised update of each matrix in `active` as this rank's block (the local shape, padding zero):
  /// blocks[a] is matrix active[a]'s local update. `orthogonalise` maps a whole matrix to its update; `meanwhile`
  /// runs once, while the first all-to-all is on the wire (or at once when nothing travels).
  std::vector<at::Tensor> run(const std::vector<size_t>& active, std::vector<at::Tensor> blocks,
                              const std::function<at::Tensor(const at::Tensor&)>& orthogonalise,
                              const std::function<void()>& meanwhile) const;

  /// Whether this rank orthogonalises matrix k.
  bool owns(size_t k) const;
  const MuonRoute& route(size_t k) const { return routes_.at(k); }

 private:
  struct Phase;
  /// Starts the all-to-all over `axis` of round r (gather or scatter); nothing when no block of it moves here.
  bool start(Phase& phase, const std::string& axis, size_t round, bool gather, const std::vector<size_t>& active,
             const std::vector<at::Tensor>& blocks, const at::TensorOptions& options) const;
  void finish(Phase& phase, std::vector<at::Tensor>& blocks) const;
  /// Whether this rank holds matrix k's block of level j + 1 in the gather (its coordinates past j are the owner's).
  bool holds(size_t k, size_t level) const;

  const dist::Mesh* mesh_ = nullptr;
  std::vector<MuonRoute> routes_;
};

}  // namespace titan::detail
