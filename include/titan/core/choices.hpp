// SPDX-License-Identifier: BSD-3-Clause
// The fixed-choice values of the job config (core/config.hpp), each an enum with one name table in
// torchtitan's spellings. Core is the lowest layer, so optim, data, parallel and checkpoint take these
// enums as they are. A config file or flag with another spelling is an error listing the choices.
#pragma once

#include "titan/core/choice.hpp"

#include <c10/core/ScalarType.h>

namespace titan {

/// optimizer.name.
enum class OptimizerName {
  adamw,  ///< decoupled weight decay (torch.optim.AdamW)
  adam,   ///< L2 weight decay added to the gradient (torch.optim.Adam)
  muon,   ///< Muon for the 2-D hidden matrices (torch.optim.Muon), AdamW for the other parameters
};
TITAN_CHOICES(OptimizerName, {OptimizerName::adamw, "AdamW"}, {OptimizerName::adam, "Adam"},
              {OptimizerName::muon, "Muon"})

/// optimizer.muon_adjust_lr_fn: how Muon scales the lr of an (A, B) matrix (torch.optim.Muon's adjust_lr_fn).
enum class MuonAdjustLr {
  original,         ///< sqrt(max(1, A / B)) (Keller Jordan's Muon)
  match_rms_adamw,  ///< 0.2 sqrt(max(A, B)): AdamW's update RMS, so AdamW's lr and decay carry over (Moonlight)
};
TITAN_CHOICES(MuonAdjustLr, {MuonAdjustLr::original, "original"}, {MuonAdjustLr::match_rms_adamw, "match_rms_adamw"})

/// optimizer.implementation: kernels with identical math.
enum class OptimizerImplementation {
  for_loop,               ///< plain per-tensor ops (the reference twin)
  foreach,                ///< ATen _foreach_* multi-tensor ops
  fused,                  ///< one fused kernel for all tensors
  fused_opt_states_bf16,  ///< fused, with exp_avg / exp_avg_sq kept in bf16 (fp32 parameters and gradients)
};
TITAN_CHOICES(OptimizerImplementation, {OptimizerImplementation::for_loop, "for-loop"},
              {OptimizerImplementation::foreach, "foreach"}, {OptimizerImplementation::fused, "fused"},
              {OptimizerImplementation::fused_opt_states_bf16, "fused_opt_states_bf16"})

/// lr_scheduler.decay_type.
enum class DecayType { linear, sqrt, cosine };
TITAN_CHOICES(DecayType, {DecayType::linear, "linear"}, {DecayType::sqrt, "sqrt"}, {DecayType::cosine, "cosine"})

/// A floating-point dtype named in the config (training.dtype, mixed precision, checkpoint.export_dtype).
enum class DType { float32, bfloat16, float16 };
TITAN_CHOICES(DType, {DType::float32, "float32"}, {DType::bfloat16, "bfloat16"}, {DType::float16, "float16"})

/// The ATen scalar type of `dtype`.
constexpr c10::ScalarType scalar_type(DType dtype) {
  switch (dtype) {
    case DType::bfloat16:
      return c10::ScalarType::BFloat16;
    case DType::float16:
      return c10::ScalarType::Half;
    case DType::float32:
      break;
  }
  return c10::ScalarType::Float;
}

/// training.dataset_format: how a dataset's files hold documents.
enum class DatasetFormat {
  text,      ///< plain UTF-8 text; see data::CorpusSpec::split_blank_lines
  jsonl,     ///< one JSON object per line; the document is data::CorpusSpec::text_field
  fortunes,  ///< Debian fortune files: quotes separated by lines holding only "%"
  chat,      ///< JSON lines of {"messages": [{"role", "content"}, ...]} for SFT (streaming sources only)
};
TITAN_CHOICES(DatasetFormat, {DatasetFormat::text, "text"}, {DatasetFormat::jsonl, "jsonl"},
              {DatasetFormat::fortunes, "fortunes"}, {DatasetFormat::chat, "chat"})

/// training.dataset_on_bad_record: what a bad record (malformed JSON, missing field, invalid UTF-8,
/// empty or unreadable file) does.
enum class OnBadRecord {
  error,  ///< throw, naming the file and line
  skip,   ///< log a warning naming the file and line, count it, and go on
};
TITAN_CHOICES(OnBadRecord, {OnBadRecord::error, "error"}, {OnBadRecord::skip, "skip"})

/// training.packing: how documents become windows of seq_len + 1 tokens.
enum class Packing {
  concat,    ///< torchtitan v0.2: one stream, windows cross documents, every label trained (default)
  document,  ///< the same windows, plus positions and document ids restarting at each document, and
             ///< no label across a document boundary: for block-causal attention
  padded,    ///< one document per window, truncated to seq_len + 1, padded with label -100 (SFT)
};
TITAN_CHOICES(Packing, {Packing::concat, "concat"}, {Packing::document, "document"}, {Packing::padded, "padded"})

/// parallelism.fsdp_reshard_after_forward: free gathered parameters after a unit's forward?
enum class ReshardAfterForward {
  default_,  ///< as always, but also keep the last block (torchtitan < 0.2; 0.2.2's default is `always`)
  always,    ///< every unit but the last (whose backward comes right after its forward)
  never,     ///< none: more memory, no second all-gather in backward
};
TITAN_CHOICES(ReshardAfterForward, {ReshardAfterForward::default_, "default"}, {ReshardAfterForward::always, "always"},
              {ReshardAfterForward::never, "never"})

/// parallelism.pipeline_parallel_schedule (torch.distributed.pipelining's names).
enum class PipelineSchedule {
  schedule_1f1b,
  gpipe,
  interleaved_1f1b,
  looped_bfs,
  interleaved_zero_bubble,
  zbv_zero_bubble,
  dual_pipe_v,
};
TITAN_CHOICES(PipelineSchedule, {PipelineSchedule::schedule_1f1b, "1F1B"}, {PipelineSchedule::gpipe, "GPipe"},
              {PipelineSchedule::interleaved_1f1b, "Interleaved1F1B"}, {PipelineSchedule::looped_bfs, "LoopedBFS"},
              {PipelineSchedule::interleaved_zero_bubble, "InterleavedZeroBubble"},
              {PipelineSchedule::zbv_zero_bubble, "ZBVZeroBubble"}, {PipelineSchedule::dual_pipe_v, "DualPipeV"})

/// parallelism.pipeline_parallel_split: how the blocks are cut into pipeline stages.
enum class PipelineSplitBy { layers, flops };
TITAN_CHOICES(PipelineSplitBy, {PipelineSplitBy::layers, "layers"}, {PipelineSplitBy::flops, "flops"})

/// parallelism.context_parallel_load_balancer.
enum class CpLoadBalancer { headtail, ptrr };
TITAN_CHOICES(CpLoadBalancer, {CpLoadBalancer::headtail, "headtail"}, {CpLoadBalancer::ptrr, "ptrr"})

/// parallelism.context_parallel_rotate_method: K/V gathered (allgather) or passed around the ring (alltoall,
/// PyTorch's name), or q/k/v swapped from sequence shards to head shards around attention (ulysses).
enum class CpRotateMethod { allgather, alltoall, ulysses };
TITAN_CHOICES(CpRotateMethod, {CpRotateMethod::allgather, "allgather"}, {CpRotateMethod::alltoall, "alltoall"},
              {CpRotateMethod::ulysses, "ulysses"})

/// parallelism.expert_parallel_comm_backend.
enum class ExpertCommBackend { standard, deepep };
TITAN_CHOICES(ExpertCommBackend, {ExpertCommBackend::standard, "standard"}, {ExpertCommBackend::deepep, "deepep"})

/// checkpoint.async_mode.
enum class AsyncMode {
  disabled,               ///< save on the training thread
  async,                  ///< stage to host memory, write on a background thread
  async_with_pinned_mem,  ///< the same, staging into pinned host memory
};
TITAN_CHOICES(AsyncMode, {AsyncMode::disabled, "disabled"}, {AsyncMode::async, "async"},
              {AsyncMode::async_with_pinned_mem, "async_with_pinned_mem"})

/// activation_checkpoint.mode.
enum class AcMode { selective, full, memory_budget, none };
TITAN_CHOICES(AcMode, {AcMode::selective, "selective"}, {AcMode::full, "full"},
              {AcMode::memory_budget, "memory_budget"}, {AcMode::none, "none"})

/// activation_checkpoint.determinism_check.
enum class DeterminismCheck { default_, none };
TITAN_CHOICES(DeterminismCheck, {DeterminismCheck::default_, "default"}, {DeterminismCheck::none, "none"})

/// comm.mode.
enum class CommMode {
  default_,      ///< real collectives
  fake_backend,  ///< a dry run without collectives
  local_tensor,  ///< every rank simulated in one process
};
TITAN_CHOICES(CommMode, {CommMode::default_, "default"}, {CommMode::fake_backend, "fake_backend"},
              {CommMode::local_tensor, "local_tensor"})

/// float8.recipe_name: float8 scaling recipe.
enum class Float8Recipe { tensorwise, rowwise, rowwise_with_gw_hp };
TITAN_CHOICES(Float8Recipe, {Float8Recipe::tensorwise, "tensorwise"}, {Float8Recipe::rowwise, "rowwise"},
              {Float8Recipe::rowwise_with_gw_hp, "rowwise_with_gw_hp"})

}  // namespace titan
