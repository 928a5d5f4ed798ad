// SPDX-License-Identifier: BSD-3-Clause
#include "titan/optim/detail/muon_exchange.hpp"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/layout/sharded_param.hpp"

namespace titan::detail {

/// One all-to-all of a round: the blocks that move over one axis.
struct MuonExchange::Phase {
  struct Member {
    size_t slot = 0;    // index into the step's active matrices
    size_t matrix = 0;  // the matrix (its route)
    size_t level = 0;   // the level of its route this phase moves
  };
  bool gather = true;
  const dist::ProcessGroup* group = nullptr;
  std::vector<Member> members{};
  at::Tensor send{};  // (sum of in_splits,) alive until the all-to-all is waited on
  at::Tensor recv{};  // (sum of out_splits,)
  dist::Work work{};
};

namespace {

const std::vector<std::pair<std::string, parallel::Placement>> kNoPlacements;  // a whole tensor's placements

int64_t block_numel(const std::vector<int64_t>& shape) { return c10::multiply_integers(shape); }

// Block `peer` of a level's block `whole` along the level's dim: its ceil-sized chunk, zero past the end.
at::Tensor scatter_block(const at::Tensor& whole, const MuonRoute& route, size_t level, int64_t peer) {
  const int64_t dim = route.levels[level].dim;
  const int64_t extent = route.shapes[level + 1][static_cast<size_t>(dim)];
  const int64_t have = whole.size(dim);
  const int64_t begin = std::min(have, peer * extent);
  const int64_t valid = std::min(have, begin + extent) - begin;
  if (valid == extent) return whole.narrow(dim, begin, extent).reshape(-1);
  at::Tensor piece = at::zeros(route.shapes[level + 1], whole.options());
  if (valid > 0) piece.narrow(dim, 0, valid).copy_(whole.narrow(dim, begin, valid));
  return piece.reshape(-1);
}

}  // namespace

MuonExchange::MuonExchange(const std::vector<at::Tensor>& matrices, const std::vector<std::string>& names,
                           const dist::Mesh* mesh)
    : mesh_(mesh), routes_(matrices.size()) {
  std::vector<size_t> sharded;
  for (size_t k = 0; k < matrices.size(); ++k) {
    const at::Tensor& p = matrices[k];
    const parallel::ShardedParam* sp = parallel::sharded_param(p);
    const std::string name = k < names.size() ? names[k] : fmt::format("matrix {}", k);
    MuonRoute& route = routes_[k];
    route.shapes.push_back(sp != nullptr ? sp->global_shape : p.sizes().vec());
    for (const auto& [axis, placement] : sp != nullptr ? sp->placements : kNoPlacements) {
      if (placement.kind != parallel::Placement::Kind::kShard) continue;
      TITAN_CHECK_VALUE(mesh != nullptr,
                        "[titan::Muon] expected the mesh {} is sharded over (MuonOptions::mesh), got none. Pass the "
                        "mesh the model was parallelized over.",
                        sp->str());
      const int64_t size = mesh->size(axis);
      if (size == 1) continue;
      route.levels.push_back({.axis = axis, .dim = placement.dim, .size = size});
      std::vector<int64_t> shape = route.shapes.back();
      auto& extent = shape[static_cast<size_t>(placement.dim)];
      extent = (extent + size - 1) / size;
      route.shapes.push_back(std::move(shape));
    }
    TITAN_CHECK_VALUE(p.sizes().vec() == route.shapes.back(),
                      "[titan::Muon] expected the local block of {} to be ({}) (ceil-sized chunks of ({}), padded at "
                      "the end), got ({}). Muon gathers a matrix from equal blocks: make the tensor-parallel degree "
                      "divide the dims it splits.",
                      name, fmt::join(route.shapes.back(), ", "), fmt::join(route.shapes.front(), ", "),
                      fmt::join(p.sizes(), ", "));
    if (!route.levels.empty()) sharded.push_back(k);
  }
  // DistMuon's balance: the largest matrix first, owners round-robin over the ranks that share each one.
  std::stable_sort(sharded.begin(), sharded.end(), [this](size_t x, size_t y) {
    return block_numel(routes_[x].shapes.front()) > block_numel(routes_[y].shapes.front());
  });
  int64_t next = 0;
  for (size_t k : sharded) {
    std::vector<MuonLevel>& levels = routes_[k].levels;
    int64_t ranks = 1;
    for (const MuonLevel& level : levels) ranks *= level.size;
    int64_t owner = next++ % ranks;
    for (size_t j = levels.size(); j-- > 0;) {
      levels[j].owner = owner % levels[j].size;
      owner /= levels[j].size;
    }
  }
}

bool MuonExchange::holds(size_t k, size_t level) const {
  const std::vector<MuonLevel>& levels = routes_[k].levels;
  for (size_t i = level + 1; i < levels.size(); ++i) {
    if (mesh_->coordinate(levels[i].axis) != levels[i].owner) return false;
  }
  return true;
}

bool MuonExchange::owns(size_t k) const {
  const std::vector<MuonLevel>& levels = routes_.at(k).levels;
  return levels.empty() || (holds(k, 0) && mesh_->coordinate(levels[0].axis) == levels[0].owner);
}

bool MuonExchange::start(Phase& phase, const std::string& axis, size_t round, bool gather,
                         const std::vector<size_t>& active, const std::vector<at::Tensor>& blocks,
                         const at::TensorOptions& options) const {
  phase.gather = gather;
  for (size_t slot = 0; slot < active.size(); ++slot) {
    const size_t k = active[slot];
    const size_t depth = routes_[k].levels.size();
    if (round >= depth) continue;
    const size_t level = depth - 1 - round;
    if (routes_[k].levels[level].axis == axis && holds(k, level))
      phase.members.push_back({.slot = slot, .matrix = k, .level = level});
  }
  // Every member of the group holds the same matrices' blocks (they differ only on this axis), so all skip alike.
  if (phase.members.empty()) return false;
  phase.group = &mesh_->group(axis);
  const int64_t n = phase.group->size(), me = phase.group->rank();
  std::vector<int64_t> send_splits(static_cast<size_t>(n)), recv_splits(static_cast<size_t>(n));
  std::vector<at::Tensor> pieces;
  // Peer by peer, the members in order: each side walks the same list, so the buffers need no header.
  for (int64_t peer = 0; peer < n; ++peer) {
    for (const Phase::Member& m : phase.members) {
      const MuonRoute& route = routes_[m.matrix];
      const int64_t owner = route.levels[m.level].owner;
      const int64_t numel = block_numel(route.shapes[m.level + 1]);
      const auto p = static_cast<size_t>(peer);
      if (gather) {
        if (owner == peer) {
          pieces.push_back(blocks[m.slot].reshape(-1));
          send_splits[p] += numel;
        }
        if (owner == me) recv_splits[p] += numel;
      } else {
        if (owner == me) {
          pieces.push_back(scatter_block(blocks[m.slot], route, m.level, peer));
          send_splits[p] += numel;
        }
        if (owner == peer) recv_splits[p] += numel;
      }
    }
  }
  phase.send = pieces.empty() ? at::empty({0}, options) : at::cat(pieces);
  phase.recv = at::empty({std::accumulate(recv_splits.begin(), recv_splits.end(), int64_t{0})}, options);
  phase.work = phase.group->all_to_all(phase.recv, phase.send, recv_splits, send_splits);
  return true;
}

void MuonExchange::finish(Phase& phase, std::vector<at::Tensor>& blocks) const {
  phase.work.wait();
  const int64_t n = phase.group->size(), me = phase.group->rank();
  int64_t offset = 0;
  const auto take = [&](const std::vector<int64_t>& shape) {
    at::Tensor block = phase.recv.narrow(0, offset, block_numel(shape)).view(shape);
    offset += block_numel(shape);
    return block;
  };
  if (!phase.gather) {
    // Each member's block of the next level, from its owner.
    for (int64_t peer = 0; peer < n; ++peer) {
      for (const Phase::Member& m : phase.members) {
        const MuonRoute& route = routes_[m.matrix];
        if (route.levels[m.level].owner == peer) blocks[m.slot] = take(route.shapes[m.level + 1]);
      }
    }
    return;
  }
  // The owner joins every peer's block along the level's dim and drops the padding; the others are done with it.
  std::vector<std::vector<at::Tensor>> parts(phase.members.size());
  for (int64_t peer = 0; peer < n; ++peer) {
    for (size_t i = 0; i < phase.members.size(); ++i) {
      const Phase::Member& m = phase.members[i];
      const MuonRoute& route = routes_[m.matrix];
      if (route.levels[m.level].owner == me) parts[i].push_back(take(route.shapes[m.level + 1]));
    }
  }
  for (size_t i = 0; i < phase.members.size(); ++i) {
    const Phase::Member& m = phase.members[i];
    const MuonRoute& route = routes_[m.matrix];
    const int64_t dim = route.levels[m.level].dim;
    blocks[m.slot] =
        parts[i].empty()
            ? at::Tensor()
            : at::cat(parts[i], dim).narrow(dim, 0, route.shapes[m.level][static_cast<size_t>(dim)]).contiguous();
  }
}

std::vector<at::Tensor> MuonExchange::run(const std::vector<size_t>& active, std::vector<at::Tensor> blocks,
                                          const std::function<at::Tensor(const at::Tensor&)>& orthogonalise,
                                          const std::function<void()>& meanwhile) const {
  if (active.empty()) {
    meanwhile();
    return blocks;
  }
  // Every buffer as the updates are (a rank that holds no block of a matrix in a round still receives one).
  const at::TensorOptions options = blocks.front().options();
  // Round r moves level depth-1-r of every matrix; its axes, in one order on every rank.
  std::vector<std::set<std::string>> rounds;
  for (size_t k : active) {
    const std::vector<MuonLevel>& levels = routes_[k].levels;
    if (rounds.size() < levels.size()) rounds.resize(levels.size());
    for (size_t r = 0; r < levels.size(); ++r) rounds[r].insert(levels[levels.size() - 1 - r].axis);
  }
  const auto exchange = [&](size_t r, bool gather, const std::function<void()>& while_on_wire) {
    std::vector<Phase> phases(rounds[r].size());
    size_t i = 0;
    for (const std::string& axis : rounds[r]) {
      if (!start(phases[i], axis, r, gather, active, blocks, options)) phases[i].group = nullptr;
      ++i;
    }
    if (while_on_wire) while_on_wire();
    for (Phase& phase : phases) {
      if (phase.group != nullptr) finish(phase, blocks);
    }
  };
  // What needs no other rank: AdamW's step and the matrices held whole, while the first blocks travel.
  const auto local_work = [&] {
    meanwhile();
    for (size_t slot = 0; slot < active.size(); ++slot) {
      if (routes_[active[slot]].levels.empty()) blocks[slot] = orthogonalise(blocks[slot]);
    }
  };
  for (size_t r = 0; r < rounds.size(); ++r) {
    exchange(r, /*gather=*/true, r == 0 ? std::function<void()>(local_work) : std::function<void()>());
  }
  if (rounds.empty()) local_work();
  for (size_t slot = 0; slot < active.size(); ++slot) {
    const size_t k = active[slot];
    if (!routes_[k].levels.empty() && owns(k)) blocks[slot] = orthogonalise(blocks[slot]);
  }
  for (size_t r = rounds.size(); r-- > 0;) exchange(r, /*gather=*/false, nullptr);
  return blocks;
}

}  // namespace titan::detail
