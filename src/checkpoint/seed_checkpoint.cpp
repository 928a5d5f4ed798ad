// SPDX-License-Identifier: BSD-3-Clause
#include "titan/checkpoint/seed_checkpoint.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/layout/sharded_param.hpp"

namespace titan::checkpoint {

namespace fs = std::filesystem;

void save_seed_checkpoint(const torch::nn::Module& model, const dist::Mesh& mesh, const fs::path& path) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), parallel::full_tensor(item.value(), mesh).to(at::kCPU, at::kFloat).contiguous());
  }
  if (mesh.rank() == 0) write_safetensors(path, tensors, {{"format", "pt"}, {"writer", "titan seed checkpoint"}});
}

void load_seed_checkpoint(torch::nn::Module& model, const fs::path& path) {
  State state;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    state.tensors.push_back(state_tensor("model." + item.key(), item.value(), nullptr));
  }
  load_safetensors(SafetensorsFile(path), state);
}

}  // namespace titan::checkpoint
