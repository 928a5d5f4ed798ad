// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/detail/trainer_core.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include "titan/core/config_loader.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/clip.hpp"
#include "titan/optim/lr_schedule.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/detail/validation.hpp"
#include "titan/train/loss.hpp"
#include "titan/train/step.hpp"

namespace titan::detail {
namespace {

void check_single_process_layout(const ParallelismConfig& p) {
  // The distributed runtime (FSDP/TP/PP/CP) is not built yet: any degree > 1 needs it.
  const std::pair<const char*, int64_t> degrees[] = {
      {"parallelism.data_parallel_replicate_degree", p.data_parallel_replicate_degree},
      {"parallelism.data_parallel_shard_degree", p.data_parallel_shard_degree},
      {"parallelism.tensor_parallel_degree", p.tensor_parallel_degree},
      {"parallelism.pipeline_parallel_degree", p.pipeline_parallel_degree},
      {"parallelism.context_parallel_degree", p.context_parallel_degree},
  };
  for (const auto& [key, degree] : degrees) {
    if (degree > 1) {
      throw ConfigError(key, fmt::format("[titan::Trainer] expected {} = 1 (or -1) in a single-process run, got {}. "
                                         "Multi-rank training needs titan's distributed runtime; set it to 1.",
                                         key, degree));
    }
  }
}

at::Device pick_device() { return at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }

at::ScalarType parse_dtype(const std::string& name, const char* key) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  throw ConfigError(key, fmt::format("[titan::Trainer] expected {} in float32|bfloat16, got '{}'.", key, name));
}

}  // namespace

TrainerCore::TrainerCore(JobConfig config, int64_t model_vocab_size) : config_(std::move(config)) {
  validate(config_);
  log::set_color(!config_.metrics.disable_color_printing && log::color());
  check_single_process_layout(config_.parallelism);
  device_ = pick_device();
  if (config_.training.num_threads > 0) at::set_num_threads(static_cast<int>(config_.training.num_threads));
  if (config_.debug.deterministic) {
    at::globalContext().setDeterministicAlgorithms(true, config_.debug.deterministic_warn_only);
  }
  seed_ = config_.debug.seed.value_or(static_cast<int64_t>(std::random_device{}() & 0x7fffffff));

  const std::filesystem::path run_dir(config_.job.dump_folder);
  std::filesystem::create_directories(run_dir);
  write_config_json(config_, run_dir / "config.json");
  if (config_.job.print_config) log::info("Effective config:\n{}", to_json(config_).dump(2));
  log::info("Run directory {} (config.json written); device {}, {} intra-op threads, seed {}", run_dir.string(),
            device_.str(), at::get_num_threads(), seed_);

  tokenizer_ = build_tokenizer(config_, model_vocab_size);
  TITAN_CHECK_VALUE(tokenizer_->vocab_size() <= model_vocab_size,
                    "[titan::Trainer] expected a tokenizer with at most {} tokens (the model's vocab_size), got {} "
                    "from model.hf_assets_path='{}'. Use a matching tokenizer or flavor.",
                    model_vocab_size, tokenizer_->vocab_size(), config_.model.hf_assets_path);

  grad_accum_steps_ = gradient_accumulation_steps(config_, dp_degree_);
  loader_ = build_dataloader(config_, tokenizer_, /*dp_rank=*/0, dp_degree_);
  if (config_.validation.enable) validator_ = std::make_unique<Validator>(config_, tokenizer_, 0, dp_degree_);
}

TrainerCore::~TrainerCore() = default;

void TrainerCore::seed_for_init() const { at::manual_seed(static_cast<uint64_t>(seed_)); }

void TrainerCore::attach_model(ModelHandle model) {
  model_ = std::move(model);
  const auto param_dtype = parse_dtype(config_.training.dtype, "training.dtype");
  if (param_dtype != at::kFloat) {
    at::NoGradGuard no_grad;
    for (auto& p : model_.parameters) p.set_data(p.to(param_dtype));
  }
  for (auto& p : model_.parameters) p.requires_grad_(true);
  optimizer_ = std::make_unique<AdamW>(model_.parameters, AdamWConfig{
                                                              .lr = config_.optimizer.lr,
                                                              .beta1 = config_.optimizer.beta1,
                                                              .beta2 = config_.optimizer.beta2,
                                                              .eps = config_.optimizer.eps,
                                                              .weight_decay = config_.optimizer.weight_decay,
                                                              .implementation = config_.optimizer.implementation,
                                                          });
  schedule_ = std::make_unique<LRSchedule>(LRScheduleConfig{
      .warmup_steps = config_.lr_scheduler.warmup_steps,
      .total_steps = config_.lr_scheduler.total_steps.value_or(config_.training.steps),
      .decay_ratio = config_.lr_scheduler.decay_ratio,
      .decay_type = config_.lr_scheduler.decay_type,
      .min_lr_factor = config_.lr_scheduler.min_lr_factor,
  });
  const PeakFlops peak = peak_flops(device_, at::get_num_threads(), config_.metrics.peak_flops);
  const std::filesystem::path run_dir(config_.job.dump_folder);
  metrics_ = std::make_unique<MetricsProcessor>(MetricsProcessor::Options{
      .flops_per_token = model_.flops_per_token,
      .peak_flops = peak.flops,
      .device = device_,
      .jsonl_path = config_.metrics.enable_jsonl ? run_dir / "metrics.jsonl" : std::filesystem::path(),
      .color = log::color(),
  });
  const MemoryStats mem = memory_stats(device_);
  log::info("{}: {} parameters, {:.4g} training FLOPs/token at seq_len {}", model_.description, model_.num_params,
            static_cast<double>(model_.flops_per_token), config_.training.seq_len);
  log::info("Peak {}", peak.description);
  log::info("Memory after model init: {:.2f} GiB", static_cast<double>(mem.max_active) / (1024.0 * 1024.0 * 1024.0));
  log::info("Trainer is initialized with local batch size {}, global batch size {}, gradient accumulation steps {}, "
            "sequence length {}, total steps {} (warmup {})",
            config_.training.local_batch_size, config_.training.local_batch_size * grad_accum_steps_ * dp_degree_,
            grad_accum_steps_, config_.training.seq_len, config_.training.steps, config_.lr_scheduler.warmup_steps);
}

void TrainerCore::train() {
  TITAN_CHECK(optimizer_ != nullptr, "[titan::Trainer] expected a model, got none. Call attach_model first.");
  log::info("Training starts at step {}", step_ + 1);
  while (step_ < config_.training.steps) train_step();
  log::info("Training completed at step {}", step_);
}

void TrainerCore::train_step() {
  ++step_;
  optimizer_->zero_grad();
  const double lr = config_.optimizer.lr * schedule_->factor(step_ - 1);

  // Pull every microbatch first: the loss is normalised by the valid tokens of the whole batch.
  const auto data_start = std::chrono::steady_clock::now();
  std::vector<Microbatch> micro;
  micro.reserve(static_cast<size_t>(grad_accum_steps_));
  for (int64_t i = 0; i < grad_accum_steps_; ++i) {
    data::Batch batch = loader_->next();
    micro.push_back({std::move(batch.input), std::move(batch.labels)});
  }
  const double data_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - data_start).count();

  // bf16 autocast on CUDA when parameters are fp32 (torchtitan's single-device mixed precision).
  const bool autocast = device_.is_cuda() && config_.training.dtype == "float32" &&
                        config_.training.mixed_precision_param == "bfloat16";
  const ForwardBackwardResult fb = forward_backward(model_.forward, micro, device_, 0, autocast);
  TITAN_CHECK(std::isfinite(fb.loss),
              "[titan::Trainer] expected a finite loss, got {} at step {}. Lower optimizer.lr, raise "
              "lr_scheduler.warmup_steps, or check the data; debug.deterministic reproduces the run.",
              fb.loss, step_);
  const double norm = clip_grad_norm_(model_.parameters, config_.training.max_norm);
  optimizer_->step(lr);
  losses_.push_back(fb.loss);

  metrics_->add_step(fb.tokens, data_seconds);
  if (step_ == 1 || step_ % config_.metrics.log_freq == 0 || step_ == config_.training.steps) {
    metrics_->log(step_, fb.loss, norm, lr);
  }
  maybe_validate(validator_.get(), step_, model_.forward, device_, *metrics_);
}

}  // namespace titan::detail
