// SPDX-License-Identifier: BSD-3-Clause
// Seed checkpoint: written once from one rank's weights, readable by the safetensors package, loaded
// onto FSDP shards (each rank reading its rows), and broken files rejected with the tensor named.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dist/rank_test_util.hpp"
#include "parallel/parity_util.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/seed_checkpoint.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/parallel/planner.hpp"

using namespace titan;

namespace {
llama3::Llama3 seeded_model(uint64_t seed) {
  nn::manual_init_seed(seed);
  llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
  model.init_weights();
  return model;
}
}  // namespace

TEST_CASE("a seed checkpoint loads onto FSDP shards and the safetensors package reads it", "[checkpoint][seed]") {
  test::TempDir dir;
  const auto path = dir.path / "seed.safetensors";
  llama3::Llama3 source = seeded_model(7);
  checkpoint::save_seed_checkpoint(source, dist::Mesh(), path);
  REQUIRE(test::fs::exists(path));
  CHECK_FALSE(test::fs::exists(path.string() + ".tmp"));

  const std::string args = fmt::format("\"{}\" \"{}\"", path.string(), (dir.path / "sums.json").string());
  REQUIRE(test::run_python("safetensors_sums.py", args) == 0);
  const auto sums = nlohmann::json::parse(test::read_file(dir.path / "sums.json"));
  const auto named = source.named_parameters();
  CHECK(sums.size() == named.size());
  for (const auto& item : named) {
    INFO(item.key());
    CHECK(sums.at(item.key()).at(0).get<std::vector<int64_t>>() == item.value().sizes().vec());
    CHECK(sums.at(item.key()).at(1).get<double>() == Approx(item.value().sum().item<double>()).margin(1e-3));
  }

  const auto expected = source.unique_parameters();
  dist::run_local_ranks(3, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 3}, rank, store, test::mesh_options());
    nn::manual_init_seed(99);  // different weights, then overwritten by the file
    llama3::Llama3 model(test::parity_args(), 32, at::TensorOptions());
    const Parallelized parallel = parallelize(model, mesh, parallel::plan(model.sharding_spec(), {}, mesh.shape()));
    model.init_weights();
    checkpoint::load_seed_checkpoint(model, path);
    const auto params = model.unique_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      RANK_CHECK_INFO("parameter " << i, at::equal(test::whole(params[i], mesh), expected[i]));
    }
    // And written back from shards it is the same file content.
    checkpoint::save_seed_checkpoint(model, mesh, dir.path / "again.safetensors");
  });
  CHECK(test::read_file(dir.path / "again.safetensors") == test::read_file(path));
}

TEST_CASE("a truncated seed checkpoint or another model's is an error naming the tensor", "[checkpoint][seed]") {
  test::TempDir dir;
  const auto path = dir.path / "seed.safetensors";
  llama3::Llama3 source = seeded_model(3);
  checkpoint::save_seed_checkpoint(source, dist::Mesh(), path);
  test::fs::resize_file(path, test::fs::file_size(path) - 100);
  llama3::Llama3 target = seeded_model(4);
  CHECK_THROWS_WITH(checkpoint::load_seed_checkpoint(target, path),
                    Catch::Contains("truncated") && Catch::Contains("output.weight"));

  llama3::Llama3Args other = test::parity_args();
  other.dim = 128;
  nn::manual_init_seed(1);
  llama3::Llama3 bigger(other, 32, at::TensorOptions());
  checkpoint::save_seed_checkpoint(source, dist::Mesh(), path);
  CHECK_THROWS_WITH(checkpoint::load_seed_checkpoint(bigger, path), Catch::Contains("tok_embeddings.weight"));
  CHECK_THROWS_WITH(checkpoint::load_seed_checkpoint(bigger, dir.path / "none.safetensors"),
                    Catch::Contains("none.safetensors"));
}
