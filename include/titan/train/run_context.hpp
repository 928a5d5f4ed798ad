// SPDX-License-Identifier: BSD-3-Clause
// RunContext: what a training process sets up from its job config before any model exists, and what every
// other training component reads: the validated config, logging, the launch environment, this rank's device, the
// mesh over parallelism.*, the seed every rank shares, the run folder (created, config.json and run_state.json
// written), the data-parallel coordinates (every replica group's ranks included) and titan's flight recorder. The
// Trainer builds one first; so does a loop of your own:
//
//   titan::RunContext run(titan::parse_args(argc, argv));
//   run.seed_for_init();
//   auto model = titan::models::build_model(run.config(), 0, {.device = run.device()});
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>

#include "titan/core/config.hpp"
#include "titan/train/run_state.hpp"

namespace titan::dist {
class Mesh;
}

namespace titan {

class RunContext {
 public:
  /// Validates `config` and sets the process up as it says (see above). Collective: every rank of the job builds
  /// one (the mesh's groups, the shared seed).
  explicit RunContext(JobConfig config);
  ~RunContext();
  RunContext(const RunContext&) = delete;
  RunContext& operator=(const RunContext&) = delete;

  const JobConfig& config() const { return config_; }
  /// This rank's device (CPU, or the GPU of LOCAL_RANK).
  const at::Device& device() const { return device_; }
  /// This rank's mesh (one process: a mesh of size 1).
  const dist::Mesh& mesh() const { return *mesh_; }
  /// The seed every rank shares: debug.seed, or rank 0's random draw.
  int64_t seed() const { return seed_; }
  /// Seeds ATen's CPU generator and titan's init generator with seed(), so every layout initialises alike: call
  /// before building and initialising a model.
  void seed_for_init() const;
  /// This rank's data-parallel index and the data-parallel degree, counted over every replica group
  /// (fault_tolerance.*): the slice of each global batch this rank reads.
  int64_t dp_rank() const { return dp_rank_; }
  int64_t dp_degree() const { return dp_degree_; }
  /// Microbatches per step on this rank (training.global_batch_size over local batch x dp_degree).
  int64_t grad_accum_steps() const { return grad_accum_steps_; }
  /// job.dump_folder, created.
  const std::filesystem::path& run_folder() const { return run_folder_; }
  /// The sum of `value` over the ranks of a mesh axis ("dp", "dp_cp", "world", ...), or `value` when it has one rank.
  double all_reduce_sum(double value, std::string_view axis) const;
  /// The maximum of `value` over the ranks of a mesh axis.
  double all_reduce_max(double value, std::string_view axis) const;
  /// What the run's numbers depend on besides the config (the bf16 GEMM kernel on CPU), settled at the start on
  /// every rank and recorded in run_state.json (train/run_state.hpp).
  const RunState& run_state() const { return run_state_; }

 private:
  JobConfig config_;
  at::Device device_ = at::kCPU;
  std::unique_ptr<dist::Mesh> mesh_;
  int64_t seed_ = 0;
  int64_t dp_rank_ = 0;
  int64_t dp_degree_ = 1;
  int64_t grad_accum_steps_ = 1;
  std::filesystem::path run_folder_;
  RunState run_state_;
};

}  // namespace titan
