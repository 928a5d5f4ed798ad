// SPDX-License-Identifier: BSD-3-Clause
// How Llama 3 is parallelized: its FSDP/HSDP/DDP units (torchtitan's: the embeddings, each
// transformer block, final norm + output together, the root) and the application of the
// data-parallel axes. Tensor parallelism joins here when its plan lands.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/parallel/data_parallel.hpp"

namespace titan::dist {
class Mesh;
}

namespace titan::llama3 {

class Llama3;

/// Module paths of each data-parallel unit, in forward order.
std::vector<std::vector<std::string>> data_parallel_units(const Llama3& model);

/// Applies FSDP/HSDP/DDP as the mesh asks (nullptr when it has no data-parallel axis).
std::shared_ptr<parallel::DataParallel> parallelize(Llama3& model, const dist::Mesh& mesh,
                                                    const parallel::DataParallelOptions& options = {});

}  // namespace titan::llama3
