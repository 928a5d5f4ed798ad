// SPDX-License-Identifier: BSD-3-Clause
// Value checks on a whole JobConfig: each names the key, what it must be and what it is. Checks that need
// the world size (degree products, batch divisibility) belong to the mesh and trainer, not here.
#include "config_detail.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <initializer_list>

namespace titan {
namespace {

// torchtitan's other converters: loaded, noted as unsupported (config_support.cpp), never applied.
constexpr std::string_view kUnsupportedConverters[] = {"mx", "quantize.linear.mx", "quantize.grouped_mm.float8",
                                                       "quantize.grouped_mm.mx"};

using config_detail::json;

void require(bool ok, std::string_view key, std::string_view must, const json& got) {
  if (ok) return;
  config_detail::fail(std::string(key), fmt::format("expected {} {}, got {}. Set it in the config file or with --{}.",
                                                    key, must, got.dump(), key));
}

// A key whose enum has more values than the key takes (training.dtype is never float16).
template <Choice E>
void one_of(std::string_view key, E value, std::initializer_list<E> allowed) {
  const bool ok = std::find(allowed.begin(), allowed.end(), value) != allowed.end();
  require(ok, key, fmt::format("to be one of {}", fmt::join(allowed, "|")), std::string(choice_name(value)));
}

void positive(std::string_view key, int64_t v) { require(v > 0, key, "> 0", v); }
void non_negative(std::string_view key, int64_t v) { require(v >= 0, key, ">= 0", v); }
void non_negative(std::string_view key, double v) { require(v >= 0, key, ">= 0", v); }
void unit_interval(std::string_view key, double v) { require(v >= 0 && v <= 1, key, "in [0, 1]", v); }
void degree(std::string_view key, int64_t v) { require(v >= 1, key, ">= 1", v); }

bool is_positive_integer(const std::string& s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         std::stoll(s) > 0;
}

void validate_training(const TrainingConfig& t) {
  positive("training.local_batch_size", t.local_batch_size);
  require(t.global_batch_size == -1 || t.global_batch_size > 0, "training.global_batch_size", "> 0 or -1 (infer)",
          t.global_batch_size);
  positive("training.seq_len", t.seq_len);
  positive("training.steps", t.steps);
  require(t.max_norm > 0, "training.max_norm", "> 0", t.max_norm);
  one_of("training.dtype", t.dtype, {DType::float32, DType::bfloat16});
  if (t.mixed_precision_param) {
    one_of("training.mixed_precision_param", *t.mixed_precision_param, {DType::bfloat16, DType::float32});
  }
  one_of("training.mixed_precision_reduce", t.mixed_precision_reduce, {DType::float32});
  positive("training.gc_freq", t.gc_freq);
  non_negative("training.num_threads", t.num_threads);
  non_negative("training.dataloader.num_workers", t.dataloader.num_workers);
  if (t.dataloader.prefetch_factor) positive("training.dataloader.prefetch_factor", *t.dataloader.prefetch_factor);
}

// The Muon keys (torch.optim.Muon's checks, momentum below 1); the matrices' schedule is muon_lr x lr / optimizer.lr.
void validate_muon(const OptimizerConfig& o) {
  if (o.name == OptimizerName::muon) {
    require(o.lr > 0, "optimizer.lr", "> 0 with optimizer.name = \"Muon\" (the matrices follow lr / optimizer.lr)",
            o.lr);
  }
  non_negative("optimizer.muon_lr", o.muon_lr);
  non_negative("optimizer.muon_weight_decay", o.muon_weight_decay);
  require(o.muon_momentum >= 0 && o.muon_momentum < 1, "optimizer.muon_momentum", "in [0, 1)", o.muon_momentum);
  require(o.muon_ns_coefficients.size() == 3, "optimizer.muon_ns_coefficients", "to hold three numbers (a, b, c)",
          o.muon_ns_coefficients);
  require(o.muon_eps > 0, "optimizer.muon_eps", "> 0", o.muon_eps);
  require(o.muon_ns_steps >= 1 && o.muon_ns_steps < 100, "optimizer.muon_ns_steps", "in 1 .. 99", o.muon_ns_steps);
}

void validate_lr_scheduler(const LRSchedulerConfig& s) {
  non_negative("lr_scheduler.warmup_steps", s.warmup_steps);
  if (s.total_steps) positive("lr_scheduler.total_steps", *s.total_steps);
  if (s.decay_ratio) unit_interval("lr_scheduler.decay_ratio", *s.decay_ratio);
  unit_interval("lr_scheduler.min_lr_factor", s.min_lr_factor);
}

// fused_opt_states_bf16 keeps fp32 master weights under bf16 moments: bf16 parameters have none.
void validate_optimizer_dtype(const OptimizerConfig& o, const TrainingConfig& t) {
  if (o.implementation != OptimizerImplementation::fused_opt_states_bf16 || t.dtype == DType::float32) return;
  config_detail::fail("optimizer.implementation",
                      fmt::format("expected training.dtype = \"float32\" with optimizer.implementation = "
                                  "\"fused_opt_states_bf16\" (fp32 parameters and gradients, bf16 exp_avg and "
                                  "exp_avg_sq), got training.dtype = \"{}\". Set training.dtype = \"float32\", or "
                                  "keep it and set optimizer.implementation = \"fused\" (bf16 parameters keep "
                                  "bf16 moments already).",
                                  choice_name(t.dtype)));
}

void validate_parallelism(const ParallelismConfig& p) {
  degree("parallelism.data_parallel_replicate_degree", p.data_parallel_replicate_degree);
  require(p.data_parallel_shard_degree == -1 || p.data_parallel_shard_degree >= 1,
          "parallelism.data_parallel_shard_degree", ">= 1 or -1 (infer)", p.data_parallel_shard_degree);
  degree("parallelism.tensor_parallel_degree", p.tensor_parallel_degree);
  degree("parallelism.pipeline_parallel_degree", p.pipeline_parallel_degree);
  degree("parallelism.context_parallel_degree", p.context_parallel_degree);
  degree("parallelism.expert_parallel_degree", p.expert_parallel_degree);
  degree("parallelism.expert_tensor_parallel_degree", p.expert_tensor_parallel_degree);
  // ep borrows its ranks from dp_shard x cp (torchtitan); with dp_shard = -1 mesh_shape checks it.
  require(p.data_parallel_shard_degree == -1 ||
              (p.data_parallel_shard_degree * p.context_parallel_degree) % p.expert_parallel_degree == 0,
          "parallelism.expert_parallel_degree",
          fmt::format("to divide data_parallel_shard_degree * context_parallel_degree = {}",
                      p.data_parallel_shard_degree * p.context_parallel_degree),
          p.expert_parallel_degree);
  // torchtitan's ParallelDims: "ETP=TP or ETP=1" (the experts split over all of tp or none of it).
  require(p.expert_tensor_parallel_degree == 1 || p.expert_tensor_parallel_degree == p.tensor_parallel_degree,
          "parallelism.expert_tensor_parallel_degree",
          fmt::format("to be 1 or tensor_parallel_degree ({})", p.tensor_parallel_degree),
          p.expert_tensor_parallel_degree);
  positive("parallelism.pipeline_parallel_microbatch_size", p.pipeline_parallel_microbatch_size);
  if (p.pipeline_parallel_layers_per_stage) {
    positive("parallelism.pipeline_parallel_layers_per_stage", *p.pipeline_parallel_layers_per_stage);
  }
  // module_fqns_per_model_part is a split given verbatim: a cost split would silently not apply.
  require(p.pipeline_parallel_split == PipelineSplitBy::layers || !p.module_fqns_per_model_part,
          "parallelism.pipeline_parallel_split", "to be layers when module_fqns_per_model_part gives the stages",
          std::string(choice_name(p.pipeline_parallel_split)));
}

void validate_checkpointing(const CheckpointConfig& c, const ActivationCheckpointConfig& ac) {
  positive("checkpoint.interval", c.interval);
  require(c.keep_latest_k == 0 || c.keep_latest_k >= 2, "checkpoint.keep_latest_k",
          "0 (keep all) or >= 2 (the newest may still be saving)", c.keep_latest_k);
  require(ac.selective_ac_option == "op" || is_positive_integer(ac.selective_ac_option),
          "activation_checkpoint.selective_ac_option", "to be a positive integer or \"op\"", ac.selective_ac_option);
  unit_interval("activation_checkpoint.memory_budget", ac.memory_budget);
}

void validate_rest(const JobConfig& c) {
  require(!c.model.name.empty(), "model.name", "to be non-empty", c.model.name);
  require(!c.model.flavor.empty(), "model.flavor", "to be non-empty", c.model.flavor);
  positive("metrics.log_freq", c.metrics.log_freq);
  non_negative("metrics.peak_flops", c.metrics.peak_flops);
  positive("profiling.profile_freq", c.profiling.profile_freq);
  positive("profiling.profiler_active", c.profiling.profiler_active);
  non_negative("profiling.profiler_warmup", c.profiling.profiler_warmup);
  // torchtitan's schedule waits profile_freq - (warmup + active) steps per cycle.
  require(!c.profiling.enable_profiling ||
              c.profiling.profile_freq >= c.profiling.profiler_warmup + c.profiling.profiler_active,
          "profiling.profile_freq",
          fmt::format(">= profiling.profiler_warmup + profiling.profiler_active ({})",
                      c.profiling.profiler_warmup + c.profiling.profiler_active),
          c.profiling.profile_freq);
  positive("comm.init_timeout_seconds", c.comm.init_timeout_seconds);
  positive("comm.train_timeout_seconds", c.comm.train_timeout_seconds);
  non_negative("comm.trace_buf_size", c.comm.trace_buf_size);
  require(
      c.comm.backend == "auto" || c.comm.backend == "gloo" || c.comm.backend == "nccl" || c.comm.backend == "strict",
      "comm.backend", "to be auto, gloo, nccl or strict (Gloo with NCCL's rules)", c.comm.backend);
  positive("validation.local_batch_size", c.validation.local_batch_size);
  positive("validation.seq_len", c.validation.seq_len);
  positive("validation.freq", c.validation.freq);
  require(c.validation.steps > 0 || c.validation.steps == -1, "validation.steps", "> 0 or -1 (whole dataset)",
          c.validation.steps);
  non_negative("validation.dataloader.num_workers", c.validation.dataloader.num_workers);
  non_negative("eval.interval", c.eval.interval);
  require(c.eval.interval == 0 || !c.eval.tasks.empty(), "eval.tasks", "task YAMLs (or folders) with eval.interval set",
          c.eval.tasks);
  non_negative("eval.max_length", c.eval.max_length);
  // The model the trainer builds has RoPE tables for training.seq_len positions.
  require(c.eval.max_length <= c.training.seq_len, "eval.max_length",
          fmt::format("at most training.seq_len ({}), the model's longest sequence", c.training.seq_len),
          c.eval.max_length);
  positive("eval.batch_size", c.eval.batch_size);
  require(c.eval.limit > 0 || c.eval.limit == -1, "eval.limit", "> 0 or -1 (every document)", c.eval.limit);
}

// [fault_tolerance]: checked only when on (torchtitan's defaults, group_size 0, load as off).
void validate_fault_tolerance(const FaultToleranceConfig& ft) {
  require(ft.enable || !ft.semi_sync_method.has_value(), "fault_tolerance.semi_sync_method",
          "unset without fault_tolerance.enable (semi-synchronous training runs across replica groups)",
          ft.semi_sync_method.value_or(""));
  if (!ft.enable) return;
  positive("fault_tolerance.group_size", ft.group_size);
  require(ft.replica_id >= 0 && ft.replica_id < ft.group_size, "fault_tolerance.replica_id",
          fmt::format("in 0 .. fault_tolerance.group_size - 1 = {}", ft.group_size - 1), ft.replica_id);
  require(ft.min_replica_size >= 1 && ft.min_replica_size <= ft.group_size, "fault_tolerance.min_replica_size",
          fmt::format("in 1 .. fault_tolerance.group_size = {}", ft.group_size), ft.min_replica_size);
  require(ft.process_group == "gloo" || ft.process_group == "nccl" || ft.process_group == "strict",
          "fault_tolerance.process_group", "to be gloo, nccl or strict (Gloo with NCCL's rules)", ft.process_group);
  positive("fault_tolerance.process_group_timeout_ms", ft.process_group_timeout_ms);
  non_negative("fault_tolerance.join_timeout_ms", ft.join_timeout_ms);
  if (!ft.semi_sync_method.has_value()) return;
  const std::string& method = *ft.semi_sync_method;
  require(method == "local_sgd" || method == "diloco", "fault_tolerance.semi_sync_method",
          "to be local_sgd or diloco (or unset: every step synchronous)", method);
  positive("fault_tolerance.sync_steps", ft.sync_steps);
  require(!ft.should_quantize, "fault_tolerance.should_quantize",
          "false (titan's outer all-reduce sends full precision; quantized all-reduce is not built)",
          ft.should_quantize);
  require(ft.num_fragments == 1, "fault_tolerance.num_fragments",
          "1 (streaming DiLoCo's fragments are not built: the whole model synchronises at once)", ft.num_fragments);
  require(ft.fragment_sync_delay == 0, "fault_tolerance.fragment_sync_delay",
          "0 (an outer all-reduce overlapping inner steps is not built)", ft.fragment_sync_delay);
  unit_interval("fault_tolerance.fragment_update_alpha", ft.fragment_update_alpha);
  require(method == "diloco" || ft.fragment_update_alpha == 0.0, "fault_tolerance.fragment_update_alpha",
          "0 under local_sgd (it mixes DiLoCo's outer step with the local parameters)", ft.fragment_update_alpha);
  require(ft.outer_lr > 0, "fault_tolerance.outer_lr", "> 0", ft.outer_lr);
  require(ft.outer_momentum >= 0 && ft.outer_momentum < 1, "fault_tolerance.outer_momentum", "in [0, 1)",
          ft.outer_momentum);
  require(!ft.outer_nesterov || ft.outer_momentum > 0, "fault_tolerance.outer_nesterov",
          "false with fault_tolerance.outer_momentum 0 (Nesterov needs momentum, as torch.optim.SGD says)",
          ft.outer_nesterov);
}

// model.converters and [float8] ([quantize.linear.float8]): names titan knows, and torchtitan's refusals.
void validate_converters(const ModelConfig& m, const Float8Config& f) {
  for (const std::string& name : m.converters) {
    const bool known = is_float8_converter(name) || name == "lora" ||
                       std::find(std::begin(kUnsupportedConverters), std::end(kUnsupportedConverters), name) !=
                           std::end(kUnsupportedConverters);
    require(known, "model.converters",
            "to hold float8 (or quantize.linear.float8) or lora; quantize.linear.mx, quantize.grouped_mm.float8 and "
            "quantize.grouped_mm.mx are recognised but not supported",
            name);
  }
  const Float8Recipe recipe = f.recipe_name.value_or(Float8Recipe::tensorwise);
  if (f.enable_fsdp_float8_all_gather && recipe != Float8Recipe::tensorwise) {
    config_detail::fail("float8.enable_fsdp_float8_all_gather",
                        fmt::format("expected float8.enable_fsdp_float8_all_gather = false with recipe_name {} "
                                    "(float8 all-gather exists for tensorwise scaling only), got true. Set "
                                    "float8.recipe_name = \"tensorwise\" or turn the all-gather off.",
                                    choice_name(recipe)));
  }
  const bool auto_filter =
      std::find(f.filter_fqns.begin(), f.filter_fqns.end(), "auto_filter_small_kn") != f.filter_fqns.end();
  if (auto_filter && recipe == Float8Recipe::rowwise_with_gw_hp) {
    config_detail::fail("float8.filter_fqns",
                        "expected no auto_filter_small_kn entry with recipe_name rowwise_with_gw_hp (torchao has "
                        "size thresholds for tensorwise and rowwise only), got one. Name the Linears to skip instead.");
  }
}

// lora.quantize_base: what QLoRA's NF4 bases cannot take in this version, each refused with its reason.
void validate_qlora(const JobConfig& c) {
  const bool float8 = std::any_of(c.model.converters.begin(), c.model.converters.end(),
                                  [](const std::string& name) { return is_float8_converter(name); });
  require(!float8, "model.converters",
          "to hold no float8 with lora.quantize_base = true (an NF4 base is dequantised to the input's dtype for its "
          "GEMM; float8 would quantise it a second time; or unset lora.quantize_base)",
          c.model.converters);
  const ParallelismConfig& p = c.parallelism;
  for (const auto& [key, degree] :
       {std::pair{"parallelism.data_parallel_replicate_degree", p.data_parallel_replicate_degree},
        std::pair{"parallelism.data_parallel_shard_degree", p.data_parallel_shard_degree},
        std::pair{"parallelism.tensor_parallel_degree", p.tensor_parallel_degree},
        std::pair{"parallelism.pipeline_parallel_degree", p.pipeline_parallel_degree},
        std::pair{"parallelism.context_parallel_degree", p.context_parallel_degree},
        std::pair{"parallelism.expert_parallel_degree", p.expert_parallel_degree}}) {
    // -1 (dp_shard's "the rest of the ranks") is 1 on one device; on more, quantize_lora_base names the sharded weight.
    require(degree <= 1, key,
            "to be 1 with lora.quantize_base = true (NF4 bases run on one device in this version: no layout shards "
            "or replicates them yet; or unset lora.quantize_base)",
            degree);
  }
  if (c.checkpoint.enable && !c.lora.save_adapter_only) {
    config_detail::fail("lora.save_adapter_only",
                        "expected lora.save_adapter_only = true with lora.quantize_base and checkpoint.enable (the "
                        "dense base is freed once in NF4: a checkpoint holds the adapters, and each start quantises "
                        "the base again from checkpoint.initial_load_path or debug.seed), got false. Set "
                        "lora.save_adapter_only = true.");
  }
  if (c.lora.merge_adapter) {
    config_detail::fail("lora.merge_adapter",
                        "expected lora.merge_adapter = false with lora.quantize_base (the final save would fold the "
                        "adapters into a base QLoRA holds in NF4 only), got true. Merge afterwards: titan-convert "
                        "to-hf --input <adapter-only step> --base <the base model>.");
  }
  if (c.checkpoint.create_seed_checkpoint || c.fault_tolerance.enable) {
    config_detail::fail(
        c.checkpoint.create_seed_checkpoint ? "checkpoint.create_seed_checkpoint" : "fault_tolerance.enable",
        "expected it off with lora.quantize_base = true (it saves or sends the dense base weights, "
        "which QLoRA frees), got true. Unset lora.quantize_base for it.");
  }
}

// [lora]: the adapters' shape and scaling, and what its switches need.
void validate_lora(const JobConfig& c) {
  const LoraConfig& l = c.lora;
  positive("lora.rank", l.rank);
  require(l.alpha > 0, "lora.alpha", "> 0", l.alpha);
  require(l.dropout >= 0 && l.dropout < 1, "lora.dropout", "in [0, 1)", l.dropout);
  for (const std::string& pattern : l.target_modules) {
    require(!pattern.empty() && !pattern.starts_with('.') && !pattern.ends_with('.'), "lora.target_modules",
            "to hold module paths or path suffixes (wq, attention.wq, layers.*.feed_forward.w2)", l.target_modules);
  }
  const bool converted =
      std::find(c.model.converters.begin(), c.model.converters.end(), "lora") != c.model.converters.end();
  for (const auto& [key, on] :
       {std::pair{"lora.save_adapter_only", l.save_adapter_only}, std::pair{"lora.merge_adapter", l.merge_adapter},
        std::pair{"lora.quantize_base", l.quantize_base}}) {
    if (on && !converted) {
      config_detail::fail(key, fmt::format("expected model.converters to hold lora with {} = true, got {}. Add lora "
                                           "to model.converters or unset {}.",
                                           key, json(c.model.converters).dump(), key));
    }
  }
  if (l.merge_adapter && l.save_adapter_only) {
    config_detail::fail("lora.merge_adapter",
                        "expected lora.save_adapter_only = false with lora.merge_adapter = true (the final save folds "
                        "the adapters into base weights it must hold), got true. Unset one, or merge afterwards with "
                        "titan-convert to-hf --base.");
  }
  if (l.quantize_base) validate_qlora(c);
  // An adapter-only checkpoint has no base weights: a resume must make the same ones again.
  if (l.save_adapter_only && c.checkpoint.enable && !c.checkpoint.initial_load_path && !c.debug.seed) {
    config_detail::fail("lora.save_adapter_only",
                        "expected checkpoint.initial_load_path (the base weights a resume loads beside the adapters) "
                        "or debug.seed (base weights initialised alike on every start) with lora.save_adapter_only = "
                        "true, got neither. Set checkpoint.initial_load_path to the base model.");
  }
}

}  // namespace

bool is_float8_converter(std::string_view name) { return name == "float8" || name == "quantize.linear.float8"; }

void validate(const OptimizerConfig& o) {
  non_negative("optimizer.lr", o.lr);
  require(o.beta1 >= 0 && o.beta1 < 1, "optimizer.beta1", "in [0, 1)", o.beta1);
  require(o.beta2 >= 0 && o.beta2 < 1, "optimizer.beta2", "in [0, 1)", o.beta2);
  require(o.eps > 0, "optimizer.eps", "> 0", o.eps);
  non_negative("optimizer.weight_decay", o.weight_decay);
  validate_muon(o);
}

void validate(const JobConfig& config) {
  validate_converters(config.model, config.float8);
  validate_training(config.training);
  validate(config.optimizer);
  validate_lr_scheduler(config.lr_scheduler);
  validate_optimizer_dtype(config.optimizer, config.training);
  validate_parallelism(config.parallelism);
  validate_checkpointing(config.checkpoint, config.activation_checkpoint);
  validate_rest(config);
  validate_fault_tolerance(config.fault_tolerance);
  validate_lora(config);
}

}  // namespace titan
