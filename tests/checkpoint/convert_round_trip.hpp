// SPDX-License-Identifier: BSD-3-Clause
// titan-convert both ways on a Hugging Face folder: from-hf to one titan safetensors file, then to-hf with
// --like the source, must give the source's tensor names and values bitwise (and its sharding). The family is
// the registry's, picked by the folder's config.json: every family's converter is checked the same way.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "dist/subprocess.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/hf.hpp"

namespace titan::test {

inline void check_convert_round_trip(const std::filesystem::path& hf, const std::filesystem::path& work,
                                     int64_t max_shard_bytes = 100000000) {
  const std::string convert = (binary_dir() / "bin" / "titan-convert").string();
  const std::filesystem::path converted = work / "converted.safetensors", back = work / "converted_back";
  auto run = [](const std::vector<std::string>& args) {
    Subprocess tool(args, {});
    const auto status = tool.wait(120);
    INFO(tool.output());
    REQUIRE(status);
    REQUIRE(exit_code(*status) == 0);
  };
  run({convert, "from-hf", "--input", hf.string(), "--output", converted.string()});
  run({convert, "to-hf", "--input", converted.string(), "--output", back.string(), "--like", hf.string(),
       "--max-shard-bytes", std::to_string(max_shard_bytes)});
  const checkpoint::HfReader original(hf), round_trip(back);
  CHECK(round_trip.names() == original.names());
  for (const auto& name : original.names()) {
    INFO(name);
    CHECK(at::equal(round_trip.read(name), original.read(name)));
  }
  CHECK(std::filesystem::exists(back / "model.safetensors.index.json") ==
        std::filesystem::exists(hf / "model.safetensors.index.json"));
}

}  // namespace titan::test
