// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/detail/trainer_core.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>

#include "titan/checkpoint/checkpointer.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/core/cpu_info.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/dist/device.hpp"
#include "titan/dist/flight_recorder.hpp"
#include "titan/dist/heartbeat.hpp"
#include "titan/dist/launch_env.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/replica_group.hpp"
#include "titan/float8/converter.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/metrics/profiler.hpp"
#include "titan/metrics/tensorboard.hpp"
#include "titan/nn/attention_context.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/loss.hpp"
#include "titan/nn/moe.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/optim/lr_schedule.hpp"
#include "titan/parallel/context_parallel.hpp"
#include "titan/parallel/data_parallel.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/pipeline.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/detail/validation.hpp"
#include "titan/train/run_state.hpp"
#include "titan/train/step.hpp"

#include "preemption.hpp"

namespace titan::detail {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// comm.backend (validated with the config) resolved for the rank's device.
std::string comm_backend(const std::string& key, const at::Device& device) {
  if (key == "auto") return device.is_cuda() ? "nccl" : "gloo";
  if (key == "nccl" && !device.is_cuda()) {
    throw ConfigError("comm.backend",
                      "[titan::Trainer] expected a GPU for comm.backend nccl, got none visible. Use auto, gloo, or "
                      "strict (Gloo with NCCL's rules) on CPUs.");
  }
  return key;
}

// torchtitan's TensorBoard folder, <dump>/<save_tb_folder>/<YYYYmmdd-HHMM>[/rank_<r>]: rank 0 writes, or
// with metrics.save_for_all_ranks every rank below one timestamp (the latest clock, agreed by all ranks).
std::filesystem::path tensorboard_folder_of(const JobConfig& config, const dist::Mesh& mesh, const at::Device& device) {
  const MetricsConfig& metrics = config.metrics;
  if (!metrics.enable_tensorboard) return {};
  std::time_t start = std::time(nullptr);
  if (metrics.save_for_all_ranks && mesh.world_size() > 1) {
    at::Tensor t = at::full({1}, static_cast<double>(start), at::TensorOptions().dtype(at::kDouble).device(device));
    mesh.group("world").all_reduce(t, dist::ReduceOp::kMax).wait();
    start = static_cast<std::time_t>(t.item<double>());
  }
  if (!metrics.save_for_all_ranks && mesh.rank() != 0) return {};
  return tensorboard_folder(config.job.dump_folder, metrics.save_tb_folder, start,
                            metrics.save_for_all_ranks ? std::optional<int64_t>(mesh.rank()) : std::nullopt);
}

void check_supported_layout(const JobConfig& c) {
  const ParallelismConfig& p = c.parallelism;
  if (p.context_parallel_degree == 1) return;
  if (p.context_parallel_load_balancer == CpLoadBalancer::ptrr) {
    throw ConfigError("parallelism.context_parallel_load_balancer",
                      "[titan::Trainer] expected parallelism.context_parallel_load_balancer headtail or None, got "
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
    throw ConfigError(key, fmt::format("[titan::Trainer] expected {} divisible by {} = context_parallel_degree {}{} x "
                                       "tensor_parallel_degree {}, got {}. Choose a multiple of {}.",
                                       key, divisor, p.context_parallel_degree, headtail ? " x 2 (headtail)" : "",
                                       p.tensor_parallel_degree, len, divisor));
  }
}

}  // namespace

TrainerCore::TrainerCore(JobConfig config, int64_t model_vocab_size) : config_(std::move(config)) {
  validate(config_);
  log::set_color(!config_.metrics.disable_color_printing && log::color());
  check_supported_layout(config_);
  const dist::LaunchEnv env = dist::read_launch_env();
  log::set_rank(static_cast<int>(env.rank));
  const dist::MeshShape shape = dist::mesh_shape(config_.parallelism, env.world_size);
  device_ = dist::select_rank_device(env.local_rank);  // before any CUDA work
  // c10d's flight recorder (comm.trace_buf_size entries; torchtitan sets the same variable).
  if (env.world_size > 1) setenv("TORCH_FR_BUFFER_SIZE", std::to_string(config_.comm.trace_buf_size).c_str(), 0);
  // titan's own flight recorder and watchdog over every collective (docs/observability.md).
  dist::enable_flight_recorder(
      {.buffer_size = env.world_size > 1 ? config_.comm.trace_buf_size : 0,
       .timeout = std::chrono::seconds(config_.comm.train_timeout_seconds),
       .folder = std::filesystem::path(config_.job.dump_folder) / config_.comm.save_traces_folder,
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
  log::info("Mesh {} ({} launch, {} backend)", shape, env.source, backend);
  if (config_.training.num_threads > 0) at::set_num_threads(static_cast<int>(config_.training.num_threads));
  use_deterministic_algorithms(config_.debug);
  seed_ = config_.debug.seed.value_or(static_cast<int64_t>(std::random_device{}() & 0x7fffffff));
  if (env.world_size > 1 && !config_.debug.seed) {  // every rank must init the same weights: rank 0's draw wins
    at::Tensor seed = at::full({1}, env.rank == 0 ? seed_ : 0, at::TensorOptions().dtype(at::kLong).device(device_));
    mesh_->group("world").all_reduce(seed).wait();
    seed_ = seed.item<int64_t>();
  }

  const std::filesystem::path run_dir(config_.job.dump_folder);
  std::filesystem::create_directories(run_dir);
  if (env.rank == 0) write_config_json(config_, run_dir / "config.json");
  if (env.rank == 0 && config_.job.save_config_file)
    write_config_json(config_, run_dir / *config_.job.save_config_file);
  if (config_.job.print_config) log::info("Effective config:\n{}", to_json(config_).dump(2));
  log::info("Run directory {} (config.json written); device {}, {} intra-op threads, seed {}", run_dir.string(),
            device_.str(), at::get_num_threads(), seed_);
  if (!device_.is_cuda()) log::info("CPU {}", cpu_info().describe());

  // Rank 0 first: a tokenizer trained on first use is written to the cache, which the others read.
  if (mesh_->rank() == 0) tokenizer_ = build_tokenizer(config_, model_vocab_size);
  mesh_->group("world").barrier();
  if (mesh_->rank() != 0) tokenizer_ = build_tokenizer(config_, model_vocab_size);
  TITAN_CHECK_VALUE(tokenizer_->vocab_size() <= model_vocab_size,
                    "[titan::Trainer] expected a tokenizer with at most {} tokens (the model's vocab_size), got {} "
                    "from model.hf_assets_path='{}'. Use a matching tokenizer or flavor.",
                    model_vocab_size, tokenizer_->vocab_size(), config_.model.hf_assets_path);

  faults_ = testing::faults();
  if (restart_count() != 0) {  // a restarted run must get past the step that killed or hung its first attempt
    faults_.kill.reset();
    faults_.hang.reset();
  }
  // Preemption saves a checkpoint, so it is armed only when this run saves them.
  const CheckpointConfig& ckpt = config_.checkpoint;
  if (ckpt.enable && !ckpt.load_only && !ckpt.create_seed_checkpoint && !ckpt.preemption_signals.empty())
    preemption_ = std::make_unique<PreemptionSignals>(ckpt.preemption_signals);
  grad_accum_steps_ = gradient_accumulation_steps(config_, dp_degree_);
  loader_ = build_dataloader(config_, tokenizer_, dp_rank_, dp_degree_);
  if (config_.validation.enable) validator_ = std::make_unique<Validator>(config_, tokenizer_, dp_rank_, dp_degree_);
}

TrainerCore::~TrainerCore() = default;

void TrainerCore::seed_for_init() const {
  at::manual_seed(static_cast<uint64_t>(seed_));
  nn::manual_init_seed(static_cast<uint64_t>(seed_));
}

void TrainerCore::convert(torch::nn::Module& model) {
  const auto& names = config_.model.converters;
  if (std::none_of(names.begin(), names.end(), [](const std::string& n) { return is_float8_converter(n); })) return;
  const float8::Float8Conversion report = float8::convert_to_float8(model, float8::converter_options(config_.float8));
  if (!report.converted.empty() && mesh_->size("tp") > 1 &&
      config_.float8.recipe_name.value_or(Float8Recipe::tensorwise) != Float8Recipe::tensorwise) {
    log::warn(
        "float8 rowwise recipes under tensor parallelism: each rank scales its own weight and activation shards "
        "(the TP styles give whole-tensor scales to tensorwise float8 only, as torchao's), so losses differ "
        "slightly from one device's float8 run");
  }
  float8_converted_ = report.converted;
}

void TrainerCore::parallelize(torch::nn::Module& model, const parallel::ParallelPlan& plan) {
  parallel_ = std::make_unique<Parallelized>(titan::parallelize(model, *mesh_, plan));
  // Every MoE layer, for the auxiliary-loss-free balancing each step: the expert-parallel ones the
  // plan sharded over ep (their gradients reduced each step), or at ep = 1 only recorded.
  if (const parallel::ExpertParallel* ep = parallel_->expert_parallel()) {
    moe_ = std::make_unique<parallel::ExpertParallel>(*ep);
  } else {
    moe_ = std::make_unique<parallel::ExpertParallel>(
        parallel::apply_expert_parallel(model, *mesh_, {.moe_modules = parallel::moe_modules(model)}));
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.key().ends_with(".expert_bias")) expert_biases_.emplace_back(item.key(), item.value());
  }
  // The sequence-wise auxiliary loss as a mean over the step's sequences, as the cross-entropy is a mean over
  // its tokens: each rank's microbatches inject their sum, weighted by one over the global batch.
  const int64_t sequences = config_.training.local_batch_size * grad_accum_steps_ * dp_degree_;
  for (const auto& layer : moe_->layers()) {
    if (layer->args.load_balance_loss_weight == 0.0) continue;
    // A sequence split over cp (or over tp by sequence parallelism) needs its counts summed over those ranks
    // before f_i is formed; that exchange is not built.
    TITAN_CHECK_NOT_IMPLEMENTED(mesh_->size("cp") == 1 && mesh_->size("tp") == 1,
                                "[titan::Trainer] expected context_parallel_degree and tensor_parallel_degree 1 with "
                                "model.moe_load_balance_loss_weight > 0, got cp {} and tp {}: the sequence-wise "
                                "auxiliary loss of a sequence split over ranks is not built. Set the weight to 0 "
                                "(bias balancing still runs) or use data, pipeline and expert parallelism.",
                                mesh_->size("cp"), mesh_->size("tp"));
    layer->aux_loss_scale = 1.0 / static_cast<double>(sequences);
  }
  if (const std::string applied = parallel_->describe(); applied != "one device") {
    log::info("Applied {} to the model", applied);
  }
  // bf16 autocast on the device when parameters are fp32 and no data parallelism casts them
  // (torchtitan's single-device mixed precision; on CPU only when asked for, see mixed_precision_param).
  // Unlike torchtitan, which turns mixed precision off under TP or PP without FSDP, titan autocasts there.
  bf16_autocast_ = !parallel_->data_parallel() && config_.training.dtype == DType::float32 &&
                   mixed_precision_param(config_.training, device_.is_cuda()) == DType::bfloat16;
  if (parallel_->loss_parallel()) {
    loss_ = [parallel = parallel_.get()](const at::Tensor& logits, const at::Tensor& labels) {
      return parallel->cross_entropy_sum(logits, labels);
    };
  }
}

void TrainerCore::attach_model(ModelHandle model) {
  model_ = std::move(model);
  step_model_ = {.forward = model_.forward, .stage_forward = model_.stage_forward};
  const at::ScalarType param_dtype = scalar_type(config_.training.dtype);
  if (param_dtype != at::kFloat) {
    at::NoGradGuard no_grad;
    for (auto& p : model_.parameters) p.set_data(p.to(param_dtype));
  }
  for (auto& p : model_.parameters) p.requires_grad_(true);
  optimizer_ = std::make_unique<AdamW>(model_.parameters, config_.optimizer);
  if (!device_.is_cuda()) {
    memory_ = std::make_unique<MemoryTracker>();
    book_gradients_on_accumulation(model_.parameters);
  }
  schedule_ = std::make_unique<LRSchedule>(config_.lr_scheduler, config_.training.steps);
  // MFU against the peak of the dtype the GEMMs run in; the bf16 GEMM kernel settled and recorded.
  const bool bf16_gemms = runs_bf16_gemms(config_, device_);
  settle_run_state(config_, device_, mesh_->group("world"), config_.job.dump_folder);
  const PeakFlops peak = peak_flops(device_, at::get_num_threads(), config_.metrics.peak_flops,
                                    bf16_gemms && nn::bf16_gemms_at_bf16_rate(device_));
  const std::filesystem::path run_dir(config_.job.dump_folder);
  metrics_ = std::make_unique<MetricsProcessor>(MetricsProcessor::Options{
      .flops_per_token = model_.flops_per_token,
      .peak_flops = peak.flops,
      // torchtitan's per-device tps: a batch is shared by the cp * tp * pp ranks that process it.
      .non_data_parallel_size = mesh_->size("tp") * mesh_->size("cp") * mesh_->size("pp"),
      .device = device_,
      .jsonl_path =
          config_.metrics.enable_jsonl && mesh_->rank() == 0 ? run_dir / "metrics.jsonl" : std::filesystem::path(),
      .tensorboard_folder = tensorboard_folder_of(config_, *mesh_, device_),
      .total_steps = config_.training.steps,
      .color = log::color(),
      .memory_parts = [this] { return memory_parts(); },
  });
  if (const auto events = metrics_->tensorboard_file()) log::info("TensorBoard events in {}", events->string());
  const ProfilingConfig& profiling = config_.profiling;
  if (profiling.enable_profiling) {
    profiler_ = std::make_unique<Profiler>(Profiler::Options{.folder = run_dir / profiling.save_traces_folder,
                                                             .rank = mesh_->rank(),
                                                             .freq = profiling.profile_freq,
                                                             .warmup = profiling.profiler_warmup,
                                                             .active = profiling.profiler_active,
                                                             .cuda = device_.is_cuda()});
  }
  if (profiling.enable_memory_snapshot) {
    snapshotter_ = std::make_unique<MemorySnapshotter>(
        MemorySnapshotter::Options{.folder = run_dir / profiling.save_memory_snapshot_folder,
                                   .rank = mesh_->rank(),
                                   .freq = profiling.profile_freq,
                                   .device = device_,
                                   .tracker = memory_.get()});
  }
  const MemoryStats mem = memory_stats(device_);
  log::info("{}: {} parameters, {:.4g} training FLOPs/token at seq_len {}", model_.description, model_.num_params,
            static_cast<double>(model_.flops_per_token), config_.training.seq_len);
  log::info("Peak {}", peak.description);
  log::info("Memory after model init: {:.2f} GiB", static_cast<double>(mem.max_active) / (1024.0 * 1024.0 * 1024.0));
  const int64_t param_bytes = storage_bytes(model_.parameters);
  log::info(
      "Memory per rank: parameters {:.3f} GiB, gradients {:.3f} GiB once computed, optimizer state {:.3f} GiB; "
      "activations and communication buffers measured from step 1 (titan-plan predicts them)",
      static_cast<double>(param_bytes) / kGiB, static_cast<double>(param_bytes) / kGiB,
      static_cast<double>(optimizer_->state_bytes()) / kGiB);
  log::info(
      "Trainer is initialized with local batch size {}, global batch size {}, gradient accumulation steps {}, "
      "sequence length {}, total steps {} (warmup {})",
      config_.training.local_batch_size, config_.training.local_batch_size * grad_accum_steps_ * dp_degree_,
      grad_accum_steps_, config_.training.seq_len, config_.training.steps, config_.lr_scheduler.warmup_steps);
  load_checkpoint();
  start_replicas();
}

template <class T>
T TrainerCore::all_reduce_sum(T value, const char* axis) const {
  if (mesh_->size(axis) == 1) return value;
  at::Tensor t = at::full({1}, static_cast<double>(value), at::TensorOptions().dtype(at::kDouble).device(device_));
  mesh_->group(axis).all_reduce(t).wait();
  return static_cast<T>(t.item<double>());
}

void TrainerCore::train() {
  TITAN_CHECK(optimizer_ != nullptr, "[titan::Trainer] expected a model, got none. Call attach_model first.");
  log::info("Training starts at step {}", step_ + 1);
  while (step_ < config_.training.steps && stop_signal_ == 0) train_step();
  dist::report_progress(step_, "training finished", /*timed=*/false);
  if (profiler_) profiler_->finish(step_);
  wait_for_checkpoint();
  // Every rank stops reading rank 0's store before rank 0 may exit.
  dist::detach_flight_recorder_store();
  mesh_->group("world").barrier();
  if (stop_signal_ != 0 && step_ < config_.training.steps) {
    log::info("Training stopped at step {} on {}; its checkpoint is saved, the same command resumes at step {}", step_,
              signal_name(stop_signal_), step_ + 1);
    return;
  }
  log::info("Training completed at step {}", step_);
}

MemoryParts TrainerCore::memory_parts() {
  MemoryParts parts{.parameters = storage_bytes(model_.parameters), .optimizer = optimizer_->state_bytes()};
  std::vector<at::Tensor> grads;
  for (const auto& p : model_.parameters) grads.push_back(p.grad());
  parts.gradients = storage_bytes(grads);
  if (memory_) {
    parts.activations = memory_->peak(MemoryCategory::activations);
    parts.communication = memory_->peak(MemoryCategory::communication);
    memory_->reset_peaks();
  } else if (device_.is_cuda()) {
    const MemoryStats stats = memory_stats(device_);
    parts.activations = std::max<int64_t>(0, stats.max_active - parts.parameters - parts.gradients - parts.optimizer);
  }
  return parts;
}

void TrainerCore::train_step() {
  const int64_t step = step_ + 1;
  if (profiler_) profiler_->begin_step(step);
  if (snapshotter_) snapshotter_->begin_step(step);
  try {
    run_step();
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    // torchtitan's exit snapshot: the memory at the failure, for PyTorch's viewer (CUDA) or titan's JSON.
    std::string where = "turn on profiling.enable_memory_snapshot for a snapshot of the next failure";
    if (snapshotter_) where = "memory snapshot in " + snapshotter_->write_on_failure(step).string();
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     fmt::format("[titan::Trainer] out of memory at step {} ({}); {}. Lower "
                                 "training.local_batch_size or seq_len, or raise parallelism or activation "
                                 "checkpointing.",
                                 step, error_message(e), where));
  }
  if (profiler_) profiler_->end_step(step);
  if (snapshotter_) snapshotter_->end_step(step);
}

void TrainerCore::run_step() {
  if (replicas_) join_replicas();
  ++step_;
  // The heartbeat (every rank's progress, read through the store) times each phase of the step.
  dist::report_progress(step_, "data loading");
  inject_step_faults(faults_, mesh_->rank(), step_);
  // CPU: this step's allocations on this thread are booked to the rank's tracker (by part).
  std::optional<TrackMemory> track;
  if (memory_) track.emplace(*memory_);
  optimizer_->zero_grad();
  const double lr = config_.optimizer.lr * schedule_->factor(step_ - 1);

  // A step that does not commit across replica groups runs again on the same batch.
  const nlohmann::json loader_before = replicas_ ? loader_->state() : nlohmann::json();
  // Every microbatch first: the loss is normalised by the valid tokens of the whole global batch.
  const StepBatch batch = pull_microbatches(*loader_, *parallel_, *mesh_, grad_accum_steps_);
  ForwardBackwardResult fb;
  {
    const MemoryScope activations(MemoryCategory::activations);
    dist::report_progress(step_, "forward/backward");
    fb = forward_backward(*parallel_, step_model_, batch, *mesh_, device_, bf16_autocast_);
    if (faults_.oom_step == step_) {  // fails inside the activations' scope, as a real one would
      TORCH_CHECK_WITH(OutOfMemoryError, false, "test fault oom: simulated out of memory at step ", step_);
    }
  }
  if (losses_.empty()) parallel_->check_contracts();  // this process's first step used the plan as planned
  TITAN_CHECK(std::isfinite(fb.loss),
              "[titan::Trainer] expected a finite loss, got {} at step {}. Lower optimizer.lr, raise "
              "lr_scheduler.warmup_steps, or check the data; debug.deterministic reproduces the run.",
              fb.loss, step_);
  if (replicas_ && !commit_over_replicas()) {
    log::warn("Step {} did not commit across the replica groups (one failed): running it again with the live ones",
              step_);
    loader_->load_state(loader_before);
    --step_;
    return;
  }
  // torchtitan's optimizer pre-step hook: each MoE layer's counts of this step's microbatches summed
  // over dp x cp, then its expert bias moved toward balance (outside autograd) and the counts zeroed.
  const std::vector<at::Tensor> loads = moe_->update_expert_bias();  // (E) each
  // Expert-parallel experts without data parallelism of their own (a hand-built plan): their gradients summed
  // over the ranks holding the same experts before clipping measures them; titan::parallelize's FSDP over
  // efsdp x dp_replicate has reduce-scattered them already, and this is a no-op.
  moe_->reduce_expert_gradients();
  dist::report_progress(step_, "optimizer step");
  const double norm = optimizer_step(*optimizer_, lr, config_.training.max_norm, *mesh_);
  losses_.push_back(fb.loss);

  metrics_->add_step(fb.tokens, batch.load_seconds);
  if (step_ == 1 || step_ % config_.metrics.log_freq == 0 || step_ == config_.training.steps) {
    double ratio = 0;  // the most loaded expert over the mean load, the worst layer
    for (const at::Tensor& load : loads) ratio = std::max(ratio, (load.max() / load.mean()).item<double>());
    if (mesh_->size("pp") > 1) {  // each stage knows its own layers; a stage may have none
      at::Tensor worst = at::full({1}, ratio, at::TensorOptions().dtype(at::kDouble).device(device_));
      mesh_->group("pp").all_reduce(worst, dist::ReduceOp::kMax).wait();
      ratio = worst.item<double>();
    }
    if (ratio > 0) metrics_->add_scalar("moe/max_load_ratio", ratio);
    if (replicas_) metrics_->add_scalar("ft/live_replicas", static_cast<double>(replicas_->live()));
    const StepMetrics logged = metrics_->log(step_, fb.loss, norm, lr);
    if (logged.parts) last_memory_ = *logged.parts;
    if (step_ == 1 && logged.parts) {
      const MemoryParts& m = *logged.parts;
      log::info(
          "Memory per rank at step 1: parameters {:.3f} GiB, gradients {:.3f} GiB, optimizer {:.3f} GiB, "
          "activations {:.3f} GiB (peak), communication {:.3f} GiB (peak){}",
          static_cast<double>(m.parameters) / kGiB, static_cast<double>(m.gradients) / kGiB,
          static_cast<double>(m.optimizer) / kGiB, static_cast<double>(m.activations) / kGiB,
          static_cast<double>(m.communication) / kGiB, device_.is_cuda() ? " (CUDA: not split out)" : "");
    }
  }
  if (parallel_->pipeline() && step_ == std::min<int64_t>(2, config_.training.steps)) write_pipeline_timeline();
  if (validator_ && validator_->due(step_)) {
    dist::report_progress(step_, "validation");
    ValidationResult r = validator_->run(
        [this](const at::Tensor& tokens, const at::Tensor& labels) {
          const parallel::LocalBatch local = parallel_->local_batch({.tokens = tokens, .labels = labels});
          if (parallel_->pipeline())
            return parallel_->pipeline()->evaluate(model_.stage_forward, local.tokens, local.labels, loss_,
                                                   local.attention);
          const at::Tensor logits = model_.forward(local.tokens, local.attention);  // (B, S/cp, V)
          return (loss_ ? loss_(logits, local.labels) : cross_entropy_sum(logits, local.labels)).item<double>();
        },
        device_);
    // Every dp rank validated its slice of each batch, every cp rank its part of the sequences.
    r.loss_sum = all_reduce_sum(r.loss_sum, "dp_cp");
    r.tokens = all_reduce_sum(r.tokens, "dp");
    if (r.tokens > 0) metrics_->log_validation(step_, r.loss(), r.tokens);
    if (parallel_->data_parallel()) parallel_->data_parallel()->reshard();  // the no-grad forward left units gathered
  }
  if (preemption_) {
    // Ranks see the signal at different moments; the largest signal number over the world decides, so
    // every rank stops after the same step. One small all-reduce per step, only while armed.
    stop_signal_ = PreemptionSignals::received();
    if (mesh_->size("world") > 1) {
      at::Tensor t = at::full({1}, stop_signal_, at::TensorOptions().dtype(at::kInt).device(device_));
      mesh_->group("world").all_reduce(t, dist::ReduceOp::kMax).wait();
      stop_signal_ = t.item<int>();
    }
  }
  // Not timed: a save's commit times the ranks' writes itself (comm.train_timeout_seconds).
  dist::report_progress(step_, "checkpoint save", /*timed=*/false);
  maybe_save_checkpoint();
}

}  // namespace titan::detail

namespace titan::detail {

void TrainerCore::write_pipeline_timeline() const {
  const parallel::PipelineTimeline timeline = parallel_->pipeline()->gather_timeline();
  if (mesh_->rank() != 0) return;
  const std::filesystem::path run_dir(config_.job.dump_folder);
  checkpoint::write_file_atomically(run_dir / "pipeline_timeline.json", parallel::timeline_json(timeline));
  checkpoint::write_file_atomically(run_dir / "pipeline_timeline.svg",
                                    parallel::render_timeline_svg(timeline, fmt::format("step {} measured", step_)));
  log::info("Pipeline step {}: measured bubble {:.1f}%, timeline in {}", step_,
            100.0 * parallel::bubble_fraction(timeline), (run_dir / "pipeline_timeline.svg").string());
}

}  // namespace titan::detail
