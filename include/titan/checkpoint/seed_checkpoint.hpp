// SPDX-License-Identifier: BSD-3-Clause
// The seed checkpoint: a model's whole initial weights written once (one safetensors file with the
// model's FQNs) and loaded onto any layout, each rank reading only the rows of its shards. titan's
// layout-invariant init already gives every layout the same weights from the seed; the seed
// checkpoint remains for weights that came from elsewhere or a run that must start from a file.
#pragma once

#include <filesystem>

namespace torch::nn {
class Module;
}
namespace titan::dist {
class Mesh;
}

namespace titan::checkpoint {

/// Writes every parameter of model, whole (sharded ones are gathered), as fp32 safetensors at path.
/// Collective over the mesh; rank 0 writes (temp file + rename, so a crash leaves no partial file).
void save_seed_checkpoint(const torch::nn::Module& model, const dist::Mesh& mesh, const std::filesystem::path& path);

/// Loads path into model's parameters (their local shards), reading only the needed byte ranges.
/// Errors name the file and the tensor: missing tensor, wrong shape, truncated file.
void load_seed_checkpoint(torch::nn::Module& model, const std::filesystem::path& path);

}  // namespace titan::checkpoint
