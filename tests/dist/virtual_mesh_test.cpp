// SPDX-License-Identifier: BSD-3-Clause
// The planning mesh (Mesh::virtual_mesh): the groups of a real mesh of the same shape, sizes, places and members
// alike, with no process group behind them, so anything that communicates over it is an error naming the group.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <mutex>

#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"

using namespace titan;
using Catch::Matchers::Contains;

namespace {

// Every group name a mesh hands out.
std::vector<std::string> group_names() {
  std::vector<std::string> names(dist::Mesh::axis_names().begin(), dist::Mesh::axis_names().end());
  for (const char* name : {"ep", "efsdp", "etp"}) names.emplace_back(name);
  return names;
}

}  // namespace

TEST_CASE("a planning mesh has the groups of the real mesh of its shape", "[dist][mesh]") {
  // 8 ranks: pp 2 x dp_shard 2 x tp 2, ep 2 borrowed from dp_shard, etp = tp.
  const dist::MeshShape shape{.pp = 2, .dp_shard = 2, .tp = 2, .ep = 2, .etp = 2};
  std::mutex mutex;
  std::vector<std::string> mismatches;
  dist::run_local_ranks(shape.world_size(), [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh real(shape, rank, store, test::mesh_options());
    const dist::Mesh planned = dist::Mesh::virtual_mesh(shape, rank);
    const std::lock_guard lock(mutex);
    for (const std::string& name : group_names()) {
      const dist::ProcessGroup& a = real.group(name);
      const dist::ProcessGroup& b = planned.group(name);
      if (a.size() != b.size() || a.rank() != b.rank() || a.global_ranks() != b.global_ranks())
        mismatches.push_back(fmt::format("rank {} group {}", rank, name));
    }
  });
  INFO(fmt::format("groups that differ: {}", fmt::join(mismatches, "; ")));
  CHECK(mismatches.empty());
}

TEST_CASE("a planning mesh refuses every collective over several ranks and names the group", "[dist][mesh]") {
  const dist::Mesh mesh = dist::Mesh::virtual_mesh({.dp_shard = 2, .tp = 2}, 3);
  CHECK(mesh.rank() == 3);
  CHECK(mesh.coordinate("dp_shard") == 1);
  CHECK(mesh.coordinate("tp") == 1);
  CHECK(mesh.group("dp").global_ranks() == std::vector<int64_t>{1, 3});
  at::Tensor t = at::ones({4});      // (4)
  at::Tensor out = at::empty({8});   // (8)
  at::Tensor half = at::empty({2});  // (2)
  const dist::ProcessGroup& tp = mesh.group("tp");
  const auto refused = [](const std::string& text, const std::string& op) {
    CHECK_THAT(text, Contains("expected no " + op) && Contains("'tp/2-3'") && Contains("planning mesh"));
  };
  refused(test::error_of([&] { tp.all_reduce(t); }), "all_reduce");
  refused(test::error_of([&] { tp.all_gather(out, t); }), "all_gather");
  refused(test::error_of([&] { tp.reduce_scatter(half, t); }), "reduce_scatter");
  refused(test::error_of([&] { tp.broadcast(t, 0); }), "broadcast");
  refused(test::error_of([&] { tp.send(t, 0, 0); }), "send");
  refused(test::error_of([&] { tp.barrier(); }), "barrier");
  // An axis of one rank is a group of one: its collectives are local, as on a real mesh.
  at::Tensor alone = at::full({2}, 3.0);  // (2)
  mesh.group("cp").all_reduce(alone).wait();
  CHECK(alone[0].item<double>() == 3.0);
  CHECK_THAT(test::error_of([] { dist::Mesh::virtual_mesh({.tp = 2}, 2); }), Contains("0 <= RANK < 2"));
  CHECK_THAT(test::error_of([] { dist::Mesh::virtual_mesh({.dp_shard = 2, .tp = 2, .etp = 4}, 0); }),
             Contains("etp 1 or tp"));
}
