// SPDX-License-Identifier: BSD-3-Clause
// Links an installed titan and runs a few of its parts: a plan for Llama 3 on one device (the default
// config checkpoints every 2nd block, as torchtitan), applied.
#include <titan/titan.hpp>

int main() {
  titan::JobConfig config;
  config.training.seq_len = 16;
  auto model = titan::llama3::Llama3::build(config, 0, at::kCPU);
  const titan::dist::Mesh mesh;
  const titan::Parallelized parallel = titan::parallelize(*model, mesh, model->parallel_plan(config, mesh));
  fmt::print("consumer: {} parameters, {}\n", model->num_params(), parallel.describe());
  return 0;
}
