// SPDX-License-Identifier: BSD-3-Clause
// Links an installed titan and runs a few of its parts: the job's model from the registry, its plan from what it
// declares and the job's settings (the default config checkpoints every 2nd block, as torchtitan), applied.
#include <titan/titan.hpp>

int main() {
  titan::JobConfig config;
  config.training.seq_len = 16;
  auto model = titan::models::build_model(config, 0, {.device = at::kCPU});
  const titan::dist::Mesh mesh;
  const titan::parallel::ParallelPlan plan =
      titan::parallel::plan(model->sharding_spec(), titan::parallel::plan_options(config, *model, false), mesh.shape());
  const titan::Parallelized parallel = titan::parallelize(*model, mesh, plan);
  fmt::print("consumer: {} parameters, {}\n", model->num_params(), parallel.describe());
  return 0;
}
