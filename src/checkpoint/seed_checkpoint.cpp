// SPDX-License-Identifier: BSD-3-Clause
#include "titan/checkpoint/seed_checkpoint.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/dist/functional.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/parallel/sharded_param.hpp"

namespace titan::checkpoint {

namespace fs = std::filesystem;

at::Tensor gather_whole(const at::Tensor& p, const dist::Mesh& mesh) {
  at::Tensor t = p.detach();
  const parallel::ShardedParam* sp = parallel::sharded_param(p);
  if (sp == nullptr) return t;
  for (auto it = sp->placements.rbegin(); it != sp->placements.rend(); ++it) {
    if (it->second.kind != parallel::Placement::Kind::kShard) continue;
    t = dist::detail::gather_along(t, mesh.group(it->first), it->second.dim);
  }
  for (size_t d = 0; d < sp->global_shape.size(); ++d) t = t.narrow(static_cast<int64_t>(d), 0, sp->global_shape[d]);
  return t.contiguous();
}

void save_seed_checkpoint(const torch::nn::Module& model, const dist::Mesh& mesh, const fs::path& path) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back(item.key(), gather_whole(item.value(), mesh).to(at::kCPU, at::kFloat).contiguous());
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
