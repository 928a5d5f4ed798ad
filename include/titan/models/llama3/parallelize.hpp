// SPDX-License-Identifier: BSD-3-Clause
// How Llama 3 is parallelized, in torchtitan's order: tensor (+ sequence, loss) parallelism over tp
// with torchtitan's plan, then FSDP/HSDP/DDP over the data-parallel axes, whose units are the
// embeddings, each transformer block, final norm + output together and the root.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/plan.hpp"
#include "titan/parallel/tensor_parallel.hpp"

namespace titan::dist {
class Mesh;
}

namespace titan::llama3 {

class Llama3;

/// Module paths of each data-parallel unit, in forward order.
std::vector<std::vector<std::string>> data_parallel_units(const Llama3& model);

/// torchtitan's TP plan (see docs/distributed.md): attention wq/wk/wv and feed-forward w1/w3
/// colwise, wo and w2 rowwise, embedding vocab-parallel, output colwise (vocab-sharded logits under
/// loss parallel), norms sequence-parallel. Checks that `degree` divides the heads and kv heads.
parallel::ParallelPlan tensor_parallel_plan(const Llama3& model, int64_t degree,
                                            const parallel::TensorParallelPlanOptions& options = {});

struct ParallelizeOptions {
  /// Sequence and loss parallelism under TP.
  parallel::TensorParallelPlanOptions tensor_parallel{};
  /// How TP runs: async (overlapped) collectives, trace.
  parallel::TensorParallelOptions tensor_parallel_runtime{};
  /// FSDP/HSDP/DDP options.
  parallel::DataParallelOptions data_parallel{};
};

/// What was applied; keep it alive as long as the model.
struct Parallelized {
  std::shared_ptr<parallel::TensorParallel> tp;  ///< null without a tp axis
  std::shared_ptr<parallel::DataParallel> dp;    ///< null without data-parallel axes (destroyed before tp)
};

/// Applies TP (mesh tp > 1), then FSDP/HSDP/DDP as the mesh asks.
Parallelized parallelize(Llama3& model, const dist::Mesh& mesh, const ParallelizeOptions& options = {});

}  // namespace titan::llama3
