// SPDX-License-Identifier: BSD-3-Clause
// Safetensors layout: u64 little-endian header size N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}} (offsets relative to the end of the header), then the raw bytes.
#include "titan/checkpoint/seed_checkpoint.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <fstream>

#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/parallel/sharded_param.hpp"

namespace titan::checkpoint {

namespace fs = std::filesystem;

void save_seed_checkpoint(const torch::nn::Module& model, const dist::Mesh& mesh, const fs::path& path) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<at::Tensor> tensors;
  int64_t offset = 0;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    at::Tensor t = parallel::full_tensor(item.value(), mesh).to(at::kCPU, at::kFloat).contiguous();
    header[item.key()] = {{"dtype", "F32"}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += static_cast<int64_t>(t.nbytes());
    tensors.push_back(std::move(t));
  }
  if (mesh.rank() != 0) return;
  header["__metadata__"] = {{"format", "pt"}, {"writer", "titan seed checkpoint"}};
  std::string json = header.dump();
  while (json.size() % 8 != 0) json += ' ';  // keep the data 8-byte aligned
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TITAN_CHECK(out.good(), "[titan::checkpoint::save_seed_checkpoint] expected to write '{}', got an open error. Check "
                "the folder's permissions and free space.", tmp.string());
    const uint64_t size = json.size();
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(json.data(), static_cast<std::streamsize>(json.size()));
    for (const auto& t : tensors) out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    out.flush();
    TITAN_CHECK(out.good(), "[titan::checkpoint::save_seed_checkpoint] expected to write {} bytes to '{}', got a write "
                "error. Check free space.", offset, tmp.string());
  }
  fs::rename(tmp, path);
}

void load_seed_checkpoint(torch::nn::Module& model, const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK_VALUE(in.good(), "[titan::checkpoint::load_seed_checkpoint] expected a readable safetensors file, got "
                    "none at '{}'. Write one with checkpoint.create_seed_checkpoint.", path.string());
  const auto file_size = static_cast<int64_t>(fs::file_size(path));
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  TITAN_CHECK_VALUE(in.good() && static_cast<int64_t>(header_size) + 8 <= file_size,
                    "[titan::checkpoint::load_seed_checkpoint] expected a safetensors header in '{}', got a file of {} "
                    "bytes. The file is truncated or not safetensors.", path.string(), file_size);
  std::string json(header_size, '\0');
  in.read(json.data(), static_cast<std::streamsize>(header_size));
  const nlohmann::json header = nlohmann::json::parse(json);
  const int64_t data_start = 8 + static_cast<int64_t>(header_size);
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    TITAN_CHECK_VALUE(header.contains(name), "[titan::checkpoint::load_seed_checkpoint] expected tensor '{}' in '{}', "
                      "got none. The checkpoint is of another model or flavor.", name, path.string());
    const auto& entry = header.at(name);
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    const parallel::ShardedParam* sp = parallel::sharded_param(item.value());
    const std::vector<int64_t> global = sp ? sp->global_shape : item.value().sizes().vec();
    TITAN_CHECK_VALUE(entry.at("dtype") == "F32" && shape == global,
                      "[titan::checkpoint::load_seed_checkpoint] expected '{}' as F32 {}, got {} {} in '{}'.", name,
                      c10::str(at::IntArrayRef(global)), entry.at("dtype").dump(), c10::str(at::IntArrayRef(shape)),
                      path.string());
    const auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
    TITAN_CHECK_VALUE(data_start + offsets[1] <= file_size,
                      "[titan::checkpoint::load_seed_checkpoint] expected tensor '{}' to end at byte {} of '{}', got a "
                      "file of {} bytes (truncated).", name, data_start + offsets[1], path.string(), file_size);
    // This rank's region is a box of the whole tensor: read its dim-0 rows, then cut the other dims.
    const int64_t rows = global.empty() ? 1 : global[0];
    const int64_t row_bytes = rows == 0 ? 0 : (offsets[1] - offsets[0]) / rows;
    const int64_t first = sp ? sp->offset[0] : 0;
    const int64_t count = sp ? sp->local_shape[0] : rows;
    std::vector<int64_t> rows_shape = global;
    if (!rows_shape.empty()) rows_shape[0] = count;
    at::Tensor region = at::empty(rows_shape, at::kFloat);  // (count, ...) then narrowed to local_shape
    in.seekg(data_start + offsets[0] + first * row_bytes);
    in.read(static_cast<char*>(region.data_ptr()), static_cast<std::streamsize>(count * row_bytes));
    TITAN_CHECK(in.good(), "[titan::checkpoint::load_seed_checkpoint] expected to read tensor '{}' from '{}', got a read "
                "error.", name, path.string());
    for (size_t d = 1; sp && d < global.size(); ++d) {
      region = region.narrow(static_cast<int64_t>(d), sp->offset[d], sp->local_shape[d]);
    }
    at::Tensor& param = item.value();
    if (param.dim() > 0 && param.size(0) != count) param.zero_();  // padding rows stay zero
    (param.dim() > 0 ? param.narrow(0, 0, count) : param).copy_(region);
  }
}

}  // namespace titan::checkpoint
