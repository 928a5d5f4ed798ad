// SPDX-License-Identifier: BSD-3-Clause
// The job configuration schema: one aggregate per section with torchtitan v0.2.2's section names, field
// names and defaults, so its TOML job files load unchanged. Loading, CLI overrides, --help and the JSON
// dump live in core/config_loader.hpp; docs/config.md explains the layers.
//
// Every field has exactly one `///` line (meaning, unit): the build extracts them for --help
// (cmake/TitanConfigDocs.cmake), so keep each on one line directly above its field.
#pragma once

#include "titan/core/choices.hpp"
#include "titan/core/detail/reflect.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

/// Where outputs go and how the job describes itself.
struct JobSectionConfig {
  /// TOML or JSON job file to load (the file layer; by extension, .json is JSON).
  std::optional<std::string> config_file{};
  /// Folder for everything the run writes (checkpoints, metrics, config.json).
  std::string dump_folder = "./outputs";
  /// Free-text description of the job, logged at start.
  std::string description = "default job";
  /// Print the effective config at start.
  bool print_config = false;
  /// Also save the effective config as JSON to this path under dump_folder.
  std::optional<std::string> save_config_file{};
  /// torchtitan's Python config-extension module; unused by titan (extend with register_preset).
  std::string custom_config_module{};
};
TITAN_CONFIG(JobSectionConfig, config_file, dump_folder, description, print_config, save_config_file,
             custom_config_module)

/// Profiler traces and memory snapshots.
struct ProfilingConfig {
  /// Collect profiler traces.
  bool enable_profiling = false;
  /// Trace folder under dump_folder.
  std::string save_traces_folder = "profile_traces";
  /// Profile every this many steps.
  int64_t profile_freq = 10;
  /// Steps the profiler is active in each cycle.
  int64_t profiler_active = 1;
  /// Warmup steps before the active steps in each cycle.
  int64_t profiler_warmup = 3;
  /// Dump memory snapshots.
  bool enable_memory_snapshot = false;
  /// Memory snapshot folder under dump_folder.
  std::string save_memory_snapshot_folder = "memory_snapshot";
};
TITAN_CONFIG(ProfilingConfig, enable_profiling, save_traces_folder, profile_freq, profiler_active, profiler_warmup,
             enable_memory_snapshot, save_memory_snapshot_folder)

/// The per-step metrics line and its sinks.
struct MetricsConfig {
  /// Log metrics every this many steps (step 1 is always logged).
  int64_t log_freq = 10;
  /// Write TensorBoard event files.
  bool enable_tensorboard = false;
  /// Plain log lines without ANSI colors.
  bool disable_color_printing = false;
  /// TensorBoard folder under dump_folder.
  std::string save_tb_folder = "tb";
  /// Write metrics from every rank instead of rank 0 only.
  bool save_for_all_ranks = false;
  /// Log to Weights & Biases.
  bool enable_wandb = false;
  /// titan: write one JSON object per logged step to metrics.jsonl in the run folder.
  bool enable_jsonl = true;
  /// titan: declared peak FLOP/s of one device for MFU (0 = auto from the device table).
  double peak_flops = 0;
};
TITAN_CONFIG(MetricsConfig, log_freq, enable_tensorboard, disable_color_printing, save_tb_folder, save_for_all_ranks,
             enable_wandb, enable_jsonl, peak_flops)

/// Which model and flavor to build, and where its HF assets are.
struct ModelConfig {
  /// Model family (train spec name).
  std::string name = "llama3";
  /// Model size within the family (debugmodel, 1B, 3B, 8B, 70B, 405B).
  std::string flavor = "debugmodel";
  /// Folder with the HF assets: tokenizer files, config.json, safetensors weights.
  std::string hf_assets_path = "./tests/assets/tokenizer";
  /// Deprecated: use hf_assets_path.
  std::optional<std::string> tokenizer_path{};
  /// Model converters to apply in order: float8, lora (comma-separated on the command line).
  std::vector<std::string> converters{};
  /// Print the model after the converters ran.
  bool print_after_conversion = false;
  /// Weight (alpha) of DeepSeek-V3's sequence-wise MoE balance loss, beside bias balancing; 0 = the flavor's (off)
  double moe_load_balance_loss_weight = 0.0;
  /// DeepSeek-V3's multi-token prediction depth D (its config.json's num_nextn_predict_layers); 0 = the flavor's (none)
  int64_t num_nextn_predict_layers = 0;
  /// Weight lambda of the multi-token prediction loss (Megatron's mtp_loss_scaling_factor; DeepSeek-V3: 0.3, then 0.1)
  double mtp_loss_scaling_factor = 0.1;
};
TITAN_CONFIG(ModelConfig, name, flavor, hf_assets_path, tokenizer_path, converters, print_after_conversion,
             moe_load_balance_loss_weight, num_nextn_predict_layers, mtp_loss_scaling_factor)

/// The optimizer: AdamW (or Adam), or Muon for the hidden matrices with AdamW for the rest.
struct OptimizerConfig {
  /// Optimizer: AdamW (decoupled weight decay) or Adam (L2 weight decay).
  OptimizerName name = OptimizerName::adamw;
  /// Peak learning rate.
  double lr = 8e-4;
  /// First-moment EMA coefficient.
  double beta1 = 0.9;
  /// Second-moment EMA coefficient.
  double beta2 = 0.95;
  /// Denominator epsilon.
  double eps = 1e-8;
  /// Decoupled weight decay coefficient.
  double weight_decay = 0.1;
  /// Regexes searched in parameter names; a match gets no weight decay (e.g. ["bias", "norm", "embeddings"]).
  std::vector<std::string> exclude_from_weight_decay{};
  /// Kernel flavor: for-loop, foreach, fused, or fused_opt_states_bf16 (bf16 exp_avg / exp_avg_sq).
  OptimizerImplementation implementation = OptimizerImplementation::fused;
  /// Step the optimizer inside backward (no gradient clipping then).
  bool early_step_in_backward = false;
  /// Muon: peak lr of the 2-D hidden matrices; the schedule scales it as it scales lr (the rest steps with AdamW).
  double muon_lr = 1e-3;
  /// Muon: decoupled weight decay of the matrices.
  double muon_weight_decay = 0.1;
  /// Muon: momentum coefficient, in [0, 1).
  double muon_momentum = 0.95;
  /// Muon: Nesterov momentum.
  bool muon_nesterov = true;
  /// Muon: the Newton-Schulz quintic's coefficients (a, b, c).
  std::vector<double> muon_ns_coefficients{3.4445, -4.7750, 2.0315};
  /// Muon: floor of the Frobenius norm the Newton-Schulz input is divided by.
  double muon_eps = 1e-7;
  /// Muon: Newton-Schulz iterations, 1 to 99.
  int64_t muon_ns_steps = 5;
  /// Muon: lr scale of an (A, B) matrix: original sqrt(max(1, A/B)) or match_rms_adamw 0.2 sqrt(max(A, B)).
  MuonAdjustLr muon_adjust_lr_fn = MuonAdjustLr::original;
  /// Muon: regexes searched in parameter names; a match steps with AdamW (as embeddings, the head, non-2-D do).
  std::vector<std::string> muon_exclude{};
};
TITAN_CONFIG(OptimizerConfig, name, lr, beta1, beta2, eps, weight_decay, exclude_from_weight_decay, implementation,
             early_step_in_backward, muon_lr, muon_weight_decay, muon_momentum, muon_nesterov, muon_ns_coefficients,
             muon_eps, muon_ns_steps, muon_adjust_lr_fn, muon_exclude)

/// Linear warmup, optional stable phase, then decay (warmup-stable-decay).
struct LRSchedulerConfig {
  /// Linear warmup length in steps.
  int64_t warmup_steps = 200;
  /// Steps the schedule spans (unset = training.steps).
  std::optional<int64_t> total_steps{};
  /// Fraction of the steps spent decaying at the end (unset = decay right after warmup).
  std::optional<double> decay_ratio{};
  /// Decay curve: linear, sqrt or cosine.
  DecayType decay_type = DecayType::linear;
  /// Final lr as a fraction of optimizer.lr, in [0, 1].
  double min_lr_factor = 0.0;
};
TITAN_CONFIG(LRSchedulerConfig, warmup_steps, total_steps, decay_ratio, decay_type, min_lr_factor)

/// Loader workers and prefetching.
struct DataLoaderConfig {
  /// Worker threads loading batches (0 = load on the training thread).
  int64_t num_workers = 0;
  /// Keep workers alive between epochs (needs num_workers > 0).
  bool persistent_workers = false;
  /// Put batches in pinned host memory.
  bool pin_memory = false;
  /// Batches each worker loads ahead (unset = 2 when num_workers > 0).
  std::optional<int64_t> prefetch_factor{};
};
TITAN_CONFIG(DataLoaderConfig, num_workers, persistent_workers, pin_memory, prefetch_factor)

/// Data, batch shape, step count and numerics.
struct TrainingConfig {
  /// Dataset name (c4_test, c4, ...).
  std::string dataset = "c4_test";
  /// Local path of the dataset (unset = the dataset's default location).
  std::optional<std::string> dataset_path{};
  /// Sequences per device per microbatch.
  int64_t local_batch_size = 8;
  /// Sequences per optimizer step over all ranks (-1 = local_batch_size x data-parallel degree).
  int64_t global_batch_size = -1;
  /// Tokens per sequence.
  int64_t seq_len = 2048;
  /// Gradient clipping max L2 norm.
  double max_norm = 1.0;
  /// Optimizer steps to train.
  int64_t steps = 10000;
  /// Offload params, grads and optimizer state to CPU under FSDP.
  bool enable_cpu_offload = false;
  /// Dtype of params, grads and optimizer state: float32 or bfloat16.
  DType dtype = DType::float32;
  /// Compute dtype under mixed precision (FSDP or autocast): bfloat16 or float32 (unset = bf16 on GPU, fp32 on CPU).
  std::optional<DType> mixed_precision_param{};
  /// Gradient reduction dtype under FSDP mixed precision (float32).
  DType mixed_precision_reduce = DType::float32;
  /// Garbage-collection interval in steps (Python only; kept for TOML compatibility).
  int64_t gc_freq = 50;
  /// Collect garbage every step to find reference cycles (Python only).
  bool gc_debug = false;
  /// titan: intra-op CPU threads (0 = auto).
  int64_t num_threads = 0;
  /// Dataloader settings.
  DataLoaderConfig dataloader{};
  /// titan: weighted mixture instead of dataset, entries "name:weight" or "name:weight:path".
  std::vector<std::string> dataset_mixture{};
  /// titan: JSON key holding the text in JSONL datasets (unset = the dataset's registered key).
  std::optional<std::string> dataset_text_field{};
  /// titan: override the dataset's format: text, jsonl, fortunes or chat (SFT).
  std::optional<DatasetFormat> dataset_format{};
  /// titan: bad records (malformed JSON, missing field, bad UTF-8, empty/unreadable file): error or skip.
  OnBadRecord dataset_on_bad_record = OnBadRecord::error;
  /// titan: packing: concat (torchtitan v0.2), document (positions and block-causal ids) or padded.
  Packing packing = Packing::concat;
};
TITAN_CONFIG(TrainingConfig, dataset, dataset_path, local_batch_size, global_batch_size, seq_len, max_norm, steps,
             enable_cpu_offload, dtype, mixed_precision_param, mixed_precision_reduce, gc_freq, gc_debug, num_threads,
             dataloader, dataset_mixture, dataset_text_field, dataset_format, dataset_on_bad_record, packing)

// training.mixed_precision_param as it applies on a device: unset is bfloat16 on GPU (torchtitan's
// default) and float32 on CPU, where fp32 is the reference and bf16 a mode asked for by name.
inline DType mixed_precision_param(const TrainingConfig& training, bool cuda) {
  return training.mixed_precision_param.value_or(cuda ? DType::bfloat16 : DType::float32);
}

/// Mesh degrees and per-parallelism options.
struct ParallelismConfig {
  /// Replicated data-parallel degree (DDP, or HSDP with dp_shard > 1).
  int64_t data_parallel_replicate_degree = 1;
  /// Sharded data-parallel (FSDP) degree; -1 = the ranks left after the other degrees.
  int64_t data_parallel_shard_degree = -1;
  /// FSDP reshard-after-forward policy: default, always or never.
  ReshardAfterForward fsdp_reshard_after_forward = ReshardAfterForward::default_;
  /// Tensor-parallel degree.
  int64_t tensor_parallel_degree = 1;
  /// Do not compute the loss on vocab-sharded logits under TP.
  bool disable_loss_parallel = false;
  /// Overlap TP's sequence all-gathers / reduce-scatters with compute, in batch chunks.
  bool enable_async_tensor_parallel = false;
  /// Pipeline-parallel degree (ranks, not stages).
  int64_t pipeline_parallel_degree = 1;
  /// Module FQNs of each pipeline stage, e.g. [["tok_embeddings","layers.0"],["layers.1"]].
  std::optional<std::vector<std::vector<std::string>>> module_fqns_per_model_part{};
  /// Layers fewer in the first stage, which also holds the embedding.
  int64_t pipeline_parallel_first_stage_less_layers = 1;
  /// Layers fewer in the last stage, which also holds norm and output.
  int64_t pipeline_parallel_last_stage_less_layers = 1;
  /// Layers per (virtual) stage (unset = inferred from schedule and degree).
  std::optional<int64_t> pipeline_parallel_layers_per_stage{};
  /// Stage cut: layers (torchtitan's even count) or flops (near-equal training FLOPs per stage).
  PipelineSplitBy pipeline_parallel_split = PipelineSplitBy::layers;
  /// Pipeline schedule name (1F1B, GPipe, Interleaved1F1B, ...).
  PipelineSchedule pipeline_parallel_schedule = PipelineSchedule::schedule_1f1b;
  /// CSV file with a custom pipeline schedule.
  std::string pipeline_parallel_schedule_csv{};
  /// Sequences per pipeline microbatch.
  int64_t pipeline_parallel_microbatch_size = 1;
  /// DualPipeV: run each overlapped F/B pair at once (bitwise as sequential; only when pp is the whole mesh).
  bool pipeline_parallel_expert_parallel_overlap = true;
  /// Context-parallel degree.
  int64_t context_parallel_degree = 1;
  /// CP load balancer: headtail or ptrr (unset = none).
  std::optional<CpLoadBalancer> context_parallel_load_balancer = CpLoadBalancer::headtail;
  /// CP attention exchange: allgather, alltoall (the K/V ring) or ulysses (head/sequence all-to-all).
  CpRotateMethod context_parallel_rotate_method = CpRotateMethod::allgather;
  /// Expert-parallel degree (MoE models only).
  int64_t expert_parallel_degree = 1;
  /// Expert tensor-parallel degree, 1 or tensor_parallel_degree: tp also splits each routed expert's hidden dim.
  int64_t expert_tensor_parallel_degree = 1;
  /// Expert-parallel communication backend: standard or deepep.
  ExpertCommBackend expert_parallel_comm_backend = ExpertCommBackend::standard;
};
TITAN_CONFIG(ParallelismConfig, data_parallel_replicate_degree, data_parallel_shard_degree, fsdp_reshard_after_forward,
             tensor_parallel_degree, disable_loss_parallel, enable_async_tensor_parallel, pipeline_parallel_degree,
             module_fqns_per_model_part, pipeline_parallel_first_stage_less_layers,
             pipeline_parallel_last_stage_less_layers, pipeline_parallel_layers_per_stage, pipeline_parallel_split,
             pipeline_parallel_schedule, pipeline_parallel_schedule_csv, pipeline_parallel_microbatch_size,
             pipeline_parallel_expert_parallel_overlap, context_parallel_degree, context_parallel_load_balancer,
             context_parallel_rotate_method, expert_parallel_degree, expert_tensor_parallel_degree,
             expert_parallel_comm_backend)

/// Sharded save/load, HF import/export.
struct CheckpointConfig {
  /// Save and load checkpoints.
  bool enable = false;
  /// Checkpoint the dataloader index under fault tolerance.
  bool enable_ft_dataloader_checkpoints = true;
  /// Checkpoint folder under dump_folder.
  std::string folder = "checkpoint";
  /// Save every this many steps.
  int64_t interval = 500;
  /// Checkpoint to start from when the run folder has none.
  std::optional<std::string> initial_load_path{};
  /// Load only the model from initial_load_path.
  bool initial_load_model_only = true;
  /// initial_load_path is HF safetensors.
  bool initial_load_in_hf = false;
  /// initial_load_path is quantized HF safetensors.
  bool initial_load_in_hf_quantized = false;
  /// The final save holds the model only.
  bool last_save_model_only = true;
  /// The final save is HF safetensors.
  bool last_save_in_hf = false;
  /// Dtype of the final model-only save: float16, bfloat16 or float32.
  DType export_dtype = DType::float32;
  /// Async saving: disabled, async or async_with_pinned_mem.
  AsyncMode async_mode = AsyncMode::disabled;
  /// Keep the newest k checkpoints (0 = all; 1 is not allowed).
  int64_t keep_latest_k = 10;
  /// Step to load (-1 = latest).
  int64_t load_step = -1;
  /// State keys not to load, e.g. optimizer,lr_scheduler,dataloader.
  std::vector<std::string> exclude_from_loading{};
  /// Also save right after step 1.
  bool enable_first_step_checkpoint = false;
  /// Initialise the full model unsharded, save it as the seed checkpoint, and stop.
  bool create_seed_checkpoint = false;
  /// Load checkpoints but never save.
  bool load_only = false;
  /// Signals that save a checkpoint at the end of the current step and stop with status 0 (empty = none).
  std::vector<std::string> preemption_signals{"SIGTERM", "SIGUSR1"};
};
TITAN_CONFIG(CheckpointConfig, enable, enable_ft_dataloader_checkpoints, folder, interval, initial_load_path,
             initial_load_model_only, initial_load_in_hf, initial_load_in_hf_quantized, last_save_model_only,
             last_save_in_hf, export_dtype, async_mode, keep_latest_k, load_step, exclude_from_loading,
             enable_first_step_checkpoint, create_seed_checkpoint, load_only, preemption_signals)

/// Which activations to recompute in backward.
struct ActivationCheckpointConfig {
  /// selective, full, none; memory_budget (torchtitan's compiler-driven policy) is an error.
  AcMode mode = AcMode::selective;
  /// Selective AC: an integer N (every N-th block) or op (per-op policy).
  std::string selective_ac_option = "2";
  /// Per-op AC: the matmuls of Linear modules whose path contains one of these are always recomputed.
  std::vector<std::string> per_op_sac_force_recompute_mm_shapes_by_fqns = {"moe.router.gate"};
  /// Stop recomputing once all needed activations are rematerialized.
  bool early_stop = false;
  /// memory_budget mode: 0 = recompute everything, 1 = save as without AC.
  double memory_budget = 0.5;
  /// Dump the memory-budget runtime/memory Pareto SVG.
  bool visualize_memory_budget_pareto = false;
  /// Restore RNG state when recomputing (deterministic dropout).
  bool preserve_rng_state = true;
  /// Recompute determinism check function.
  DeterminismCheck determinism_check = DeterminismCheck::default_;
  /// Capture AC debug information (slower).
  bool debug = false;
};
TITAN_CONFIG(ActivationCheckpointConfig, mode, selective_ac_option, per_op_sac_force_recompute_mm_shapes_by_fqns,
             early_stop, memory_budget, visualize_memory_budget_pareto, preserve_rng_state, determinism_check, debug)

/// torch.compile in torchtitan; titan has no graph compiler yet.
struct CompileConfig {
  /// Compile the components below.
  bool enable = false;
  /// What to compile: model, loss.
  std::vector<std::string> components = {"model", "loss"};
  /// Compiler backend.
  std::string backend = "inductor";
};
TITAN_CONFIG(CompileConfig, enable, components, backend)

/// Float8 training of Linear layers (torchtitan's [quantize.linear.float8] loads here too).
struct Float8Config {
  /// All-gather FSDP params in float8 (tensorwise scaling).
  bool enable_fsdp_float8_all_gather = false;
  /// Precompute float8 scales for FSDP in one pass after the optimizer step.
  bool precompute_float8_dynamic_scale_for_fsdp = false;
  /// Scaling recipe: tensorwise, rowwise or rowwise_with_gw_hp (unset = tensorwise).
  std::optional<Float8Recipe> recipe_name{};
  /// Linear FQNs kept in high precision, e.g. output; the entry auto_filter_small_kn also skips small GEMMs.
  std::vector<std::string> filter_fqns{};
  /// Emulate float8 matmuls in high precision (tests, CPUs).
  bool emulate = false;
};
TITAN_CONFIG(Float8Config, enable_fsdp_float8_all_gather, precompute_float8_dynamic_scale_for_fsdp, recipe_name,
             filter_fqns, emulate)

// True for the model.converters names of float8 training: float8 and torchtitan's quantize.linear.float8.
bool is_float8_converter(std::string_view name);

/// Process-group timeouts and flight recorder.
struct CommConfig {
  /// Collective timeout during init and the first step, in seconds.
  int64_t init_timeout_seconds = 300;
  /// Collective timeout after the first step, in seconds.
  int64_t train_timeout_seconds = 100;
  /// Flight-recorder ring buffer entries (0 = off).
  int64_t trace_buf_size = 20000;
  /// Flight-recorder trace folder under dump_folder.
  std::string save_traces_folder = "comm_traces";
  /// Flight-recorder trace file prefix.
  std::string save_traces_file_prefix = "rank_";
  /// default, fake_backend (dry run without collectives) or local_tensor.
  CommMode mode = CommMode::default_;
  /// Process-group backend (titan's): auto (NCCL on GPU, else Gloo), gloo, nccl, strict (Gloo + NCCL's rules).
  std::string backend = "auto";
};
TITAN_CONFIG(CommConfig, init_timeout_seconds, train_timeout_seconds, trace_buf_size, save_traces_folder,
             save_traces_file_prefix, mode, backend)

// Each replica group is its own job; the groups meet in a quorum through a lighthouse every step,
// average gradients over the live ones and heal a replica that (re)joins from a live one.
/// Replica fault tolerance (TorchFT's idea over HSDP; docs/fault_tolerance.md).
struct FaultToleranceConfig {
  /// Train as one replica group of a fault-tolerant job.
  bool enable = false;
  /// Backend of the cross-replica groups (gloo; nccl on GPUs).
  std::string process_group = "gloo";
  /// Timeout of each cross-replica collective and of the commit vote, in milliseconds.
  int64_t process_group_timeout_ms = 10000;
  /// This replica group's id, 0 .. group_size - 1 (its share of the data).
  int64_t replica_id = 0;
  /// Replica groups the job is planned with (the data is split into this many shares).
  int64_t group_size = 0;
  /// Fewest live replica groups a step may run with.
  int64_t min_replica_size = 1;
  /// Semi-synchronous training (local_sgd or diloco; unset = every step synchronous).
  std::optional<std::string> semi_sync_method{};
  /// Semi-sync: inner steps between two outer steps across the replica groups.
  int64_t sync_steps = 5;
  /// Semi-sync: quantize the outer all-reduce (refused: titan sends full precision).
  bool should_quantize = false;
  /// Streaming DiLoCo: inner steps a fragment's all-reduce may overlap (only 0 is built).
  int64_t fragment_sync_delay = 0;
  /// DiLoCo: weight of the local parameters mixed into the new global ones, in [0, 1] (0: take the global).
  double fragment_update_alpha = 0.0;
  /// Streaming DiLoCo: fragments of the model synchronised in turn (only 1 is built).
  int64_t num_fragments = 1;
  /// DiLoCo: the outer SGD's learning rate (torchtitan builds SGD(lr=0.7, momentum=0.9, nesterov=True)).
  double outer_lr = 0.7;
  /// DiLoCo: the outer SGD's momentum, in [0, 1).
  double outer_momentum = 0.9;
  /// DiLoCo: Nesterov momentum in the outer SGD.
  bool outer_nesterov = true;
  /// host:port of titan-lighthouse, or http://host:port of TorchFT's torchft_lighthouse; empty = $TITAN_FT_LIGHTHOUSE.
  std::string lighthouse{};
  /// How long, in ms, a quorum of titan's lighthouse waits for the previous quorum's replicas before it goes on.
  int64_t join_timeout_ms = 60000;
};
TITAN_CONFIG(FaultToleranceConfig, enable, process_group, process_group_timeout_ms, replica_id, group_size,
             min_replica_size, semi_sync_method, sync_steps, should_quantize, fragment_sync_delay,
             fragment_update_alpha, num_fragments, outer_lr, outer_momentum, outer_nesterov, lighthouse,
             join_timeout_ms)

/// Periodic evaluation on a held-out dataset.
struct ValidationConfig {
  /// Run validation every freq steps (and at step 1).
  bool enable = false;
  /// Validation dataset name.
  std::string dataset = "c4_validation";
  /// Local path of the validation dataset.
  std::optional<std::string> dataset_path{};
  /// Validation sequences per device per batch.
  int64_t local_batch_size = 8;
  /// Validation tokens per sequence.
  int64_t seq_len = 2048;
  /// Validate every this many steps.
  int64_t freq = 10;
  /// Validation batches per run (-1 = the whole dataset).
  int64_t steps = -1;
  /// Validation dataloader settings.
  DataLoaderConfig dataloader{};
};
TITAN_CONFIG(ValidationConfig, enable, dataset, dataset_path, local_batch_size, seq_len, freq, steps, dataloader)

/// titan: evaluation on lm-eval-harness tasks during training, through titan-eval's path (docs/evaluation.md).
struct EvalConfig {
  /// Evaluate every this many steps (0 = never).
  int64_t interval = 0;
  /// lm-eval task YAMLs over local data, or folders of them.
  std::vector<std::string> tasks{};
  /// Tokens a forward sees, the rolling window (0 = training.seq_len).
  int64_t max_length = 0;
  /// Requests per forward.
  int64_t batch_size = 8;
  /// Documents per task (-1 = all).
  int64_t limit = -1;
};
TITAN_CONFIG(EvalConfig, interval, tasks, max_length, batch_size, limit)

/// Seeds and determinism.
struct DebugConfig {
  /// Base RNG seed (unset = nondeterministic).
  std::optional<int64_t> seed{};
  /// Use deterministic algorithms where available (slower).
  bool deterministic = false;
  /// Only warn about ops without a deterministic implementation.
  bool deterministic_warn_only = false;
  /// Route tokens round-robin so every expert gets the same load (MoE debugging).
  bool moe_force_load_balance = false;
};
TITAN_CONFIG(DebugConfig, seed, deterministic, deterministic_warn_only, moe_force_load_balance)

/// LoRA fine-tuning (model.converters lora): low-rank adapters trained beside frozen base weights (docs/lora.md).
struct LoraConfig {
  /// Rank r of each adapter: lora_a (r, in_features), lora_b (out_features, r).
  int64_t rank = 8;
  /// Scaling of the adapters' output: alpha / rank.
  double alpha = 16.0;
  /// Dropout probability on the adapters' input, in [0, 1) (training forwards only).
  double dropout = 0.0;
  /// Linears to adapt, by FQN pattern: an entry matches a path equal to it or ending in .entry, * within one name.
  std::vector<std::string> target_modules{};
  /// Checkpoints hold the adapters, not the frozen base (a resume reads it from checkpoint.initial_load_path).
  bool save_adapter_only = false;
  /// The final HF save (checkpoint.last_save_in_hf) folds the adapters into the base instead of a PEFT folder.
  bool merge_adapter = false;
  /// QLoRA: the adapted Linears' frozen base weights held in NF4, quantised once loaded, dequantised on use.
  bool quantize_base = false;
};
TITAN_CONFIG(LoraConfig, rank, alpha, dropout, target_modules, save_adapter_only, merge_adapter, quantize_base)

/// The whole job: one member per section, named as the TOML sections.
struct JobConfig {
  JobSectionConfig job{};
  ProfilingConfig profiling{};
  MetricsConfig metrics{};
  ModelConfig model{};
  OptimizerConfig optimizer{};
  LRSchedulerConfig lr_scheduler{};
  TrainingConfig training{};
  ParallelismConfig parallelism{};
  CheckpointConfig checkpoint{};
  ActivationCheckpointConfig activation_checkpoint{};
  CompileConfig compile{};
  Float8Config float8{};
  CommConfig comm{};
  FaultToleranceConfig fault_tolerance{};
  ValidationConfig validation{};
  EvalConfig eval{};
  DebugConfig debug{};
  LoraConfig lora{};
};
TITAN_CONFIG(JobConfig, job, profiling, metrics, model, optimizer, lr_scheduler, training, parallelism, checkpoint,
             activation_checkpoint, compile, float8, comm, fault_tolerance, validation, eval, debug, lora)

}  // namespace titan
