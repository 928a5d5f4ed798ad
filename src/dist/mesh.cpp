// SPDX-License-Identifier: BSD-3-Clause
#include "titan/dist/mesh.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <iterator>
#include <type_traits>
#include <vector>

#include "flight_recorder_impl.hpp"
#include "interface.hpp"
#include "store_impl.hpp"
#include "titan/core/config.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/launch_env.hpp"
#include "titan/dist/store.hpp"

namespace titan::dist {
namespace {

// Mesh coordinates in torchtitan's order, slowest first: pp, dp_replicate, dp_shard, cp, tp.
constexpr int kAxes = 5;
using Coord = std::array<int64_t, kAxes>;

std::array<int64_t, kAxes> sizes_of(const MeshShape& s) { return {s.pp, s.dp_replicate, s.dp_shard, s.cp, s.tp}; }

Coord coordinate_of(int64_t rank, const std::array<int64_t, kAxes>& sizes) {
  Coord c{};
  for (int a = kAxes - 1; a >= 0; --a) {
    c[a] = rank % sizes[a];
    rank /= sizes[a];
  }
  return c;
}

int64_t rank_of(const Coord& c, const std::array<int64_t, kAxes>& sizes) {
  int64_t rank = 0;
  for (int a = 0; a < kAxes; ++a) rank = rank * sizes[a] + c[a];
  return rank;
}

// Every axis and flattened axis set, in creation order, with the base axes it spans (bit a: axis a of
// Coord). The one table of mesh axis names: groups, base_axes() and the error text all read it.
struct AxisSet {
  std::string_view name;
  unsigned mask;
};
constexpr std::string_view kBaseAxes[kAxes] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
constexpr AxisSet kAxisSets[] = {{"world", 0b11111},    {"pp", 0b00001},          {"dp_replicate", 0b00010},
                                 {"dp_shard", 0b00100}, {"cp", 0b01000},          {"tp", 0b10000},
                                 {"dp", 0b00110},       {"dp_shard_cp", 0b01100}, {"dp_cp", 0b01110}};
static_assert(std::size(kAxisSets) == std::tuple_size_v<std::remove_cvref_t<decltype(Mesh::axis_names())>>);

// Which of the five axes a named group spans (none for an unknown name).
std::vector<int> axes_of(std::string_view name) {
  std::vector<int> axes;
  for (const AxisSet& set : kAxisSets) {
    if (set.name != name) continue;
    for (int a = 0; a < kAxes; ++a) {
      if (set.mask & (1u << a)) axes.push_back(a);
    }
  }
  return axes;
}

// The world ranks that share this rank's coordinates outside `axes`, in row-major order of `axes`.
std::vector<int64_t> members(const Coord& self, const std::vector<int>& axes, const std::array<int64_t, kAxes>& sizes) {
  std::vector<int64_t> ranks;
  int64_t count = 1;
  for (int a : axes) count *= sizes[a];
  for (int64_t i = 0; i < count; ++i) {
    Coord c = self;
    int64_t rest = i;
    for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
      c[*it] = rest % sizes[*it];
      rest /= sizes[*it];
    }
    ranks.push_back(rank_of(c, sizes));
  }
  return ranks;
}

// Makes the group `unique` of the world ranks `ranks` in which this rank is `group_rank`.
using MakeGroup =
    std::function<ProcessGroup(const std::string& unique, int64_t group_rank, std::vector<int64_t> ranks)>;

void check_mesh(const MeshShape& shape, int64_t rank) {
  TITAN_CHECK_VALUE(rank >= 0 && rank < shape.world_size(),
                    "[titan::dist::Mesh] expected 0 <= RANK < {} ({}), got RANK {}.", shape.world_size(), shape, rank);
  TITAN_CHECK_VALUE(shape.ep >= 1 && (shape.dp_shard * shape.cp) % shape.ep == 0,
                    "[titan::dist::Mesh] expected ep dividing dp_shard({}) * cp({}), got ep {}. Change "
                    "parallelism.expert_parallel_degree.",
                    shape.dp_shard, shape.cp, shape.ep);
  TITAN_CHECK_VALUE(shape.etp == 1 || shape.etp == shape.tp,
                    "[titan::dist::Mesh] expected etp 1 or tp ({}), got etp {}. Change "
                    "parallelism.expert_tensor_parallel_degree to 1 or {}.",
                    shape.tp, shape.etp, shape.tp);
}

// Every group of rank's view of a mesh of `shape`, each made by `make`. Every rank walks the names in the same
// order; each joins only its own groups, and a flattened set with the same members as an earlier group shares
// that group.
std::map<std::string, ProcessGroup, std::less<>> mesh_groups(const MeshShape& shape, int64_t rank,
                                                             const MakeGroup& make) {
  check_mesh(shape, rank);
  const auto sizes = sizes_of(shape);
  const Coord self = coordinate_of(rank, sizes);
  std::map<std::string, ProcessGroup, std::less<>> groups;
  std::map<std::vector<int64_t>, ProcessGroup> by_members;
  auto join = [&](std::string_view name, const std::vector<int64_t>& ranks) {
    if (auto it = by_members.find(ranks); it != by_members.end()) {
      groups.emplace(std::string(name), it->second);
      return;
    }
    int64_t group_rank = 0;
    while (ranks[static_cast<size_t>(group_rank)] != rank) ++group_rank;
    ProcessGroup group = make(fmt::format("{}/{}", name, fmt::join(ranks, "-")), group_rank, ranks);
    by_members.emplace(ranks, group);
    groups.emplace(std::string(name), group);
  };
  for (std::string_view name : Mesh::axis_names()) join(name, members(self, axes_of(name), sizes));
  // Expert parallelism: dp_shard_cp (index i = dp_shard * cp + cp, in its group order) unflattened
  // into (efsdp, ep), ep fastest, as torchtitan's sparse mesh.
  const std::vector<int64_t> shard_cp = members(self, axes_of("dp_shard_cp"), sizes);
  const int64_t i = self[2] * shape.cp + self[3];
  std::vector<int64_t> ep_ranks, efsdp_ranks;
  for (int64_t j = 0; j < static_cast<int64_t>(shard_cp.size()); ++j) {
    if (j / shape.ep == i / shape.ep) ep_ranks.push_back(shard_cp[static_cast<size_t>(j)]);
    if (j % shape.ep == i % shape.ep) efsdp_ranks.push_back(shard_cp[static_cast<size_t>(j)]);
  }
  join("ep", ep_ranks);
  join("efsdp", efsdp_ranks);
  // The experts' tensor-parallel axis is tp itself (torchtitan's ep x etp mesh with etp = tp), or no axis.
  groups.emplace("etp", shape.etp > 1 ? groups.at("tp") : ProcessGroup::single("etp"));
  return groups;
}

}  // namespace

std::string format_as(const MeshShape& s) {
  return fmt::format("dp_replicate({}) * dp_shard({}) * cp({}) * tp({}) * pp({}) = {}", s.dp_replicate, s.dp_shard,
                     s.cp, s.tp, s.pp, s.world_size());
}

MeshShape mesh_shape(const ParallelismConfig& p, int64_t world_size) {
  MeshShape s{.pp = p.pipeline_parallel_degree,
              .dp_replicate = p.data_parallel_replicate_degree,
              .dp_shard = p.data_parallel_shard_degree,
              .cp = p.context_parallel_degree,
              .tp = p.tensor_parallel_degree};
  for (auto [key, value] : {std::pair{"pipeline_parallel_degree", s.pp},
                            {"data_parallel_replicate_degree", s.dp_replicate},
                            {"context_parallel_degree", s.cp},
                            {"tensor_parallel_degree", s.tp}}) {
    if (value < 1)
      throw ConfigError(std::string("parallelism.") + key,
                        fmt::format("[titan::dist::mesh_shape] expected parallelism.{} >= 1, got {}.", key, value));
  }
  if (s.dp_shard == -1) {
    const int64_t others = s.pp * s.dp_replicate * s.cp * s.tp;
    if (world_size % others != 0) {
      throw ConfigError(
          "parallelism.data_parallel_shard_degree",
          fmt::format("[titan::dist::mesh_shape] expected WORLD_SIZE ({}) divisible by pp({}) * dp_replicate({}) "
                      "* cp({}) * tp({}) = {} to infer data_parallel_shard_degree. Change the degrees or "
                      "the number of ranks.",
                      world_size, s.pp, s.dp_replicate, s.cp, s.tp, others));
    }
    s.dp_shard = world_size / others;
  }
  if (s.dp_shard < 1) {
    throw ConfigError(
        "parallelism.data_parallel_shard_degree",
        fmt::format("[titan::dist::mesh_shape] expected data_parallel_shard_degree >= 1 or -1, got {}.", s.dp_shard));
  }
  if (p.expert_parallel_degree < 1 || (s.dp_shard * s.cp) % p.expert_parallel_degree != 0) {
    throw ConfigError("parallelism.expert_parallel_degree",
                      fmt::format("[titan::dist::mesh_shape] expected expert_parallel_degree dividing dp_shard({}) * "
                                  "cp({}) = {} (ep borrows its ranks from them), got {}. Change "
                                  "parallelism.expert_parallel_degree or data_parallel_shard_degree.",
                                  s.dp_shard, s.cp, s.dp_shard * s.cp, p.expert_parallel_degree));
  }
  s.ep = p.expert_parallel_degree;
  // torchtitan's constraint (ParallelDims: "ETP=TP or ETP=1"): the experts split over all of tp or none of it.
  if (p.expert_tensor_parallel_degree != 1 && p.expert_tensor_parallel_degree != s.tp) {
    throw ConfigError("parallelism.expert_tensor_parallel_degree",
                      fmt::format("[titan::dist::mesh_shape] expected expert_tensor_parallel_degree 1 or "
                                  "tensor_parallel_degree ({}), got {}. Set parallelism.expert_tensor_parallel_degree "
                                  "to 1 (experts whole on each tp rank) or to {} (experts split over tp).",
                                  s.tp, p.expert_tensor_parallel_degree, s.tp));
  }
  s.etp = p.expert_tensor_parallel_degree;
  if (s.world_size() != world_size) {
    throw ConfigError("parallelism",
                      fmt::format("[titan::dist::mesh_shape] expected the parallel degrees to multiply to "
                                  "WORLD_SIZE, got {} != WORLD_SIZE({}). Change parallelism.* or the number "
                                  "of ranks (data_parallel_shard_degree = -1 takes the ranks left).",
                                  s, world_size));
  }
  return s;
}

const std::array<std::string_view, 9>& Mesh::axis_names() {
  static const std::array<std::string_view, 9> names = [] {
    std::array<std::string_view, 9> out;
    for (size_t i = 0; i < out.size(); ++i) out[i] = kAxisSets[i].name;
    return out;
  }();
  return names;
}

std::vector<std::string_view> Mesh::base_axes(std::string_view axis) {
  std::vector<std::string_view> out;
  for (int a : axes_of(axis)) out.push_back(kBaseAxes[a]);
  TITAN_CHECK_VALUE(!out.empty(), "[titan::dist::Mesh] expected a mesh axis ({}), got '{}'.",
                    fmt::join(axis_names(), ", "), axis);
  return out;
}

Mesh Mesh::from_launch_env(const MeshShape& shape, const MeshOptions& options) {
  const LaunchEnv env = read_launch_env();
  TITAN_CHECK_VALUE(shape.world_size() == env.world_size,
                    "[titan::dist::Mesh::from_launch_env] expected a mesh of "
                    "WORLD_SIZE ({}) ranks, got {}. Launch {} ranks or change the degrees.",
                    env.world_size, shape, shape.world_size());
  if (env.world_size == 1) return Mesh();
  if (options.backend != "nccl") detail::check_gloo_ifname_env();
  const Store store = Store::tcp(env.master_addr, env.master_port, env.rank == 0, env.world_size, options.init_timeout);
  detail::attach_store(store.impl()->store, env.rank, env.world_size);  // flight recorder: stop requests
  return Mesh(shape, env.rank, store, options);
}

Mesh Mesh::from_launch_env(const ParallelismConfig& parallelism, const MeshOptions& options) {
  return from_launch_env(mesh_shape(parallelism, read_launch_env().world_size), options);
}

Mesh::Mesh() {
  for (std::string_view name : axis_names())
    groups_.emplace(std::string(name), ProcessGroup::single(std::string(name)));
  for (std::string_view name : {"ep", "efsdp", "etp"})
    groups_.emplace(std::string(name), ProcessGroup::single(std::string(name)));
}

Mesh::Mesh(const MeshShape& shape, int64_t rank, const Store& store, const MeshOptions& options)
    : shape_(shape), rank_(rank) {
  const GroupOptions group_options{
      .init_timeout = options.init_timeout, .timeout = options.timeout, .backend = options.backend};
  groups_ = mesh_groups(shape, rank, [&](const std::string& unique, int64_t group_rank, std::vector<int64_t> ranks) {
    const auto size = static_cast<int64_t>(ranks.size());
    return ProcessGroup::create(unique, store, group_rank, size, std::move(ranks), group_options);
  });
}

Mesh Mesh::virtual_mesh(const MeshShape& shape, int64_t rank) {
  Mesh mesh;
  mesh.shape_ = shape;
  mesh.rank_ = rank;
  mesh.groups_ =
      mesh_groups(shape, rank, [](const std::string& unique, int64_t group_rank, std::vector<int64_t> ranks) {
        const auto size = static_cast<int64_t>(ranks.size());
        return ProcessGroup::unconnected(unique, group_rank, size, std::move(ranks));
      });
  return mesh;
}

const ProcessGroup& Mesh::group(std::string_view axis) const {
  auto it = groups_.find(axis);
  TITAN_CHECK_VALUE(it != groups_.end(), "[titan::dist::Mesh] expected a mesh axis ({}), got '{}'.",
                    fmt::join(axis_names(), ", "), axis);
  return it->second;
}

}  // namespace titan::dist
