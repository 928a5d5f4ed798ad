// SPDX-License-Identifier: BSD-3-Clause
// The run state: what a forward reads beyond its arguments and the config, chosen per machine. Today one
// item, the bf16 GEMM kernel on CPU (nn/bf16_gemm.hpp): the two kernels differ by up to one bf16 ulp per
// GEMM, so a run's numbers depend on it. It is settled once at the start (rank 0's on every rank), recorded
// in the run folder's run_state.json beside config.json and in every checkpoint's train_state, and a
// resume that settles otherwise says so (docs/mixed_precision.md). scripts/check_ambient_state.py lists it
// as the library's one "run" state.
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include "titan/core/config.hpp"
#include "titan/nn/bf16_gemm.hpp"

namespace titan::dist {
class ProcessGroup;
}

namespace titan {

/// The run state of this process.
struct RunState {
  /// How CPU bf16 GEMMs run; none when the job's GEMMs are not bf16 on CPU (fp32, CUDA, float8).
  std::optional<nn::Bf16Gemm> bf16_gemm{};
};

/// Whether the job's GEMMs run in bf16: bf16 parameters or bf16 mixed precision, except float8 on CPU
/// (its GEMMs are fp32, src/float8/linear.cpp). Also the peak MFU is measured against.
bool runs_bf16_gemms(const JobConfig& config, const at::Device& device);

/// This process's run state now: the bf16 GEMM kernel in force, where the job runs bf16 GEMMs on CPU.
RunState current_run_state(const JobConfig& config, const at::Device& device);

/// Settles the run state at a run's start: logs the bf16 GEMM choice and why, makes every rank of `world`
/// run rank 0's (collective; a rank overruled says so), and on rank 0 writes `run_dir`/run_state.json
/// (temp file + rename). Returns what it settled.
RunState settle_run_state(const JobConfig& config, const at::Device& device, const dist::ProcessGroup& world,
                          const std::filesystem::path& run_dir);

/// {"bf16_gemm": "native" | "widened" | null}: what run_state.json and a checkpoint's train_state hold
/// (null: the job runs no bf16 GEMMs on CPU).
nlohmann::json run_state_json(const RunState& state);

/// The warning a resumed run logs when the checkpoint's train_state records a run state other than
/// `now`, naming both and how to run the checkpoint's; none when they agree or either side has nothing
/// to compare (an older checkpoint, a run without bf16 CPU GEMMs).
std::optional<std::string> run_state_change(const nlohmann::json& train_state, const RunState& now);

}  // namespace titan
