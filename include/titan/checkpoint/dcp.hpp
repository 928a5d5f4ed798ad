// SPDX-License-Identifier: BSD-3-Clause
// torch.distributed.checkpoint (DCP) folders as FileSystemWriter writes them, torchtitan's checkpoint format:
// `.metadata` (a pickle of torch.distributed.checkpoint.metadata.Metadata: each flattened key's tensor dtype, size
// and chunks or a bytes item, and where each chunk or item lies) and `__<rank>_<i>.distcp` files holding every item
// as a torch.save archive, back to back. The reader builds nothing but those classes (any other class in the
// metadata is refused by name) and assembles each tensor whole from its chunks, whatever the saving mesh was; the
// writer writes one rank's folder of whole tensors that torch.distributed.checkpoint.load reads onto any mesh.
//
//   checkpoint::DcpReader dcp("outputs/checkpoint/step-100");
//   at::Tensor w = dcp.read_tensor("layers.0.attention.wq.weight");
//   int64_t step = dcp.read_object("train_state.step")->integer;
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "titan/checkpoint/pickle.hpp"

namespace titan::checkpoint {

/// A DCP folder opened for reading; its metadata is checked when opened.
class DcpReader {
 public:
  explicit DcpReader(std::filesystem::path folder);

  /// One tensor of the checkpoint: dtype and global shape.
  struct TensorInfo {
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> shape{};
  };
  /// The flattened keys of the tensors ("layers.0.attention.wq.weight", "optimizer.state.<fqn>.exp_avg").
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  /// The flattened keys of the other items (torch.save'd objects: "train_state.step", "lr_scheduler.last_epoch").
  const std::vector<std::string>& objects() const { return objects_; }
  /// The whole tensor, from every chunk any rank saved.
  at::Tensor read_tensor(const std::string& key) const;
  /// The object under key (plain data: ints, floats, bools, str, bytes, lists, tuples, dicts).
  PyRef read_object(const std::string& key) const;
  const std::filesystem::path& folder() const { return folder_; }

  /// Where an item lies: a byte range of a file in the folder.
  struct Location {
    std::string file;    ///< a plain name inside the folder
    int64_t offset = 0;  ///< first byte
    int64_t length = 0;  ///< bytes
  };
  /// One saved chunk of a tensor: its rectangle in the global tensor and where it lies.
  struct Chunk {
    std::vector<int64_t> offsets{};  ///< of its first element in the global tensor
    std::vector<int64_t> sizes{};    ///< of the rectangle
    Location at{};                   ///< its torch.save archive
  };

 private:
  std::string read_bytes(const Location& at, const std::string& key) const;

  std::filesystem::path folder_;
  std::map<std::string, TensorInfo> tensors_{};
  std::vector<std::string> objects_{};
  std::map<std::string, std::vector<Chunk>> chunks_{};  ///< tensor key -> its chunks
  std::map<std::string, Location> object_at_{};         ///< object key -> its archive
};

/// One entry of a DCP folder to write: a tensor or an object, under the key its `path` joins with '.', where path
/// is what torch's flatten_state_dict recorded for it (("optimizer", "state.w.exp_avg") for a nested state dict's
/// entry, ("w",) for a top-level one).
struct DcpEntry {
  std::vector<std::string> path{};  ///< the nested state dict's keys leading to it
  at::Tensor tensor{};              ///< a tensor entry, or undefined
  PyRef object{};                   ///< an object entry (plain data), or null
};

/// Writes entries as a DCP folder of one rank (`.metadata` + `__0_0.distcp`), whole or not at all (temporary folder,
/// renamed). torch.distributed.checkpoint.load(state, checkpoint_id=folder) reads it under any mesh.
void write_dcp(const std::filesystem::path& folder, const std::vector<DcpEntry>& entries);

}  // namespace titan::checkpoint
