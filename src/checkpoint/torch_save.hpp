// SPDX-License-Identifier: BSD-3-Clause
// torch.save's file: a zip archive (entries stored, not compressed) of <name>/data.pkl, the pickle of the object
// whose tensor storages are persistent ids naming <name>/data/<key>, plus <name>/version and <name>/byteorder.
// DCP's FileSystemWriter writes each item of a checkpoint as one such archive, back to back in a .distcp file.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

#include "titan/checkpoint/pickle.hpp"

namespace titan::checkpoint::detail {

/// The object of a torch.save archive holding no tensor (an int, a list of floats, ...). `what` names it in errors.
PyRef read_saved_object(std::string_view archive, const std::string& what);
/// The tensor of a torch.save archive of one tensor (torch._utils._rebuild_tensor_v2 over one storage).
at::Tensor read_saved_tensor(std::string_view archive, const std::string& what);

/// torch.save(object) of a tensor-free object; torch.load reads it back.
std::string save_object(const PyValue& object);
/// torch.save(tensor) of a CPU tensor (written contiguous); torch.load(weights_only=True) reads it back.
std::string save_tensor(const at::Tensor& tensor);

}  // namespace titan::checkpoint::detail
