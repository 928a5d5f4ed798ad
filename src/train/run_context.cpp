// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/run_context.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <random>
#include <system_error>

#include "titan/core/config_loader.hpp"
#include "titan/core/cpu_info.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/device.hpp"
#include "titan/dist/flight_recorder.hpp"
#include "titan/dist/launch_env.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/nn/init.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/step.hpp"

namespace titan {
namespace {

// comm.backend (validated with the config) resolved for the rank's device.
std::string comm_backend(const std::string& key, const at::Device& device) {
  if (key == "auto") return device.is_cuda() ? "nccl" : "gloo";
  if (key == "nccl" && !device.is_cuda()) {
    throw ConfigError("comm.backend",
                      "[titan::RunContext] expected a GPU for comm.backend nccl, got none visible. Use auto, gloo, or "
                      "strict (Gloo with NCCL's rules) on CPUs.");
  }
  return key;
}

void check_supported_layout(const JobConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  if (p.context_parallel_degree == 1) return;
  if (p.context_parallel_load_balancer == CpLoadBalancer::ptrr) {
    throw ConfigError("parallelism.context_parallel_load_balancer",
                      "[titan::RunContext] expected parallelism.context_parallel_load_balancer headtail or None, got "
                      "ptrr (torchtitan's per-token round robin for FlexAttention), which titan does not implement. "
                      "Use headtail.");
  }
  // torchtitan's seq_len_divisor: 2 chunks per cp rank (headtail), each rank's tokens split over tp.
  const bool headtail = p.context_parallel_load_balancer.has_value();
  const int64_t divisor = p.context_parallel_degree * (headtail ? 2 : 1) * p.tensor_parallel_degree;
  const std::pair<const char*, int64_t> lengths[] = {{"training.seq_len", c.training.seq_len},
                                                     {"validation.seq_len", c.validation.seq_len}};
  for (const auto& [key, len] : lengths) {
    if (len % divisor == 0 || (std::string_view(key) == "validation.seq_len" && !c.validation.enable)) continue;
    throw ConfigError(key, fmt::format("[titan::RunContext] expected {} divisible by {} = context_parallel_degree "
                                       "{}{} x tensor_parallel_degree {}, got {}. Choose a multiple of {}.",
                                       key, divisor, p.context_parallel_degree, headtail ? " x 2 (headtail)" : "",
                                       p.tensor_parallel_degree, len, divisor));
  }
}

// job.dump_folder, created; a path that is a file (or cannot be made a folder) is the config's error, not
// std::filesystem's.
std::filesystem::path make_run_folder(const std::string& dump_folder) {
  const std::filesystem::path folder(dump_folder);
  std::error_code ec;
  if (std::filesystem::exists(folder, ec) && !std::filesystem::is_directory(folder, ec)) {
    throw ConfigError("job.dump_folder", fmt::format("[titan::RunContext] expected job.dump_folder to be a folder, got "
                                                     "'{}', which is a file. Pick another folder or remove the file.",
                                                     folder.string()));
  }
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    throw ConfigError("job.dump_folder", fmt::format("[titan::RunContext] expected to create the run folder "
                                                     "job.dump_folder '{}', got: {}. Pick a writable folder.",
                                                     folder.string(), ec.message()));
  }
  return folder;
}

}  // namespace

RunContext::RunContext(JobConfig config) : config_(std::move(config)) {
  validate(config_);
  log::set_color(!config_.metrics.disable_color_printing && log::color());
  check_supported_layout(config_);
  const dist::LaunchEnv env = dist::read_launch_env();
  log::set_rank(static_cast<int>(env.rank));
  const dist::MeshShape shape = dist::mesh_shape(config_.parallelism, env.world_size);
  device_ = dist::select_rank_device(env.local_rank);  // before any CUDA work
  run_folder_ = make_run_folder(config_.job.dump_folder);
  // c10d's flight recorder (comm.trace_buf_size entries; torchtitan sets the same variable).
  if (env.world_size > 1) setenv("TORCH_FR_BUFFER_SIZE", std::to_string(config_.comm.trace_buf_size).c_str(), 0);
  // titan's own flight recorder and watchdog over every collective (docs/observability.md).
  dist::enable_flight_recorder({.buffer_size = env.world_size > 1 ? config_.comm.trace_buf_size : 0,
                                .timeout = std::chrono::seconds(config_.comm.train_timeout_seconds),
                                .folder = run_folder_ / config_.comm.save_traces_folder,
                                .file_prefix = config_.comm.save_traces_file_prefix});
  const std::string backend = comm_backend(config_.comm.backend, device_);
  mesh_ = std::make_unique<dist::Mesh>(
      dist::Mesh::from_launch_env(shape, {.backend = backend,
                                          .init_timeout = std::chrono::seconds(config_.comm.init_timeout_seconds),
                                          .timeout = std::chrono::seconds(config_.comm.train_timeout_seconds)}));
  dp_degree_ = shape.dp();
  dp_rank_ = mesh_->coordinate("dp");
  if (config_.fault_tolerance.enable) {  // every replica group reads its share of each global batch
    dp_rank_ += config_.fault_tolerance.replica_id * dp_degree_;
    dp_degree_ *= config_.fault_tolerance.group_size;
  }
  grad_accum_steps_ = gradient_accumulation_steps(config_, dp_degree_);
  log::info("Mesh {} ({} launch, {} backend)", shape, env.source, backend);
  if (config_.training.num_threads > 0) at::set_num_threads(static_cast<int>(config_.training.num_threads));
  use_deterministic_algorithms(config_.debug);
  seed_ = config_.debug.seed.value_or(static_cast<int64_t>(std::random_device{}() & 0x7fffffff));
  if (env.world_size > 1 && !config_.debug.seed) {  // every rank must init the same weights: rank 0's draw wins
    seed_ = static_cast<int64_t>(all_reduce_sum(env.rank == 0 ? static_cast<double>(seed_) : 0.0, "world"));
  }
  if (env.rank == 0) write_config_json(config_, run_folder_ / "config.json");
  if (env.rank == 0 && config_.job.save_config_file)
    write_config_json(config_, run_folder_ / *config_.job.save_config_file);
  if (config_.job.print_config) log::info("Effective config:\n{}", to_json(config_).dump(2));
  log::info("Run directory {} (config.json written); device {}, {} intra-op threads, seed {}", run_folder_.string(),
            device_.str(), at::get_num_threads(), seed_);
  if (!device_.is_cuda()) log::info("CPU {}", cpu_info().describe());
  run_state_ = settle_run_state(config_, device_, mesh_->group("world"), run_folder_);
}

RunContext::~RunContext() = default;

void RunContext::seed_for_init() const {
  at::manual_seed(static_cast<uint64_t>(seed_));
  nn::manual_init_seed(static_cast<uint64_t>(seed_));
}

double RunContext::all_reduce_sum(double value, std::string_view axis) const {
  if (mesh_->size(axis) == 1) return value;
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(device_));
  mesh_->group(axis).all_reduce(t).wait();
  return t.item<double>();
}

double RunContext::all_reduce_max(double value, std::string_view axis) const {
  if (mesh_->size(axis) == 1) return value;
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(device_));
  mesh_->group(axis).all_reduce(t, dist::ReduceOp::kMax).wait();
  return t.item<double>();
}

}  // namespace titan
