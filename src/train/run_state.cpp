// SPDX-License-Identifier: BSD-3-Clause
#include "titan/train/run_state.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/process_group.hpp"

namespace titan {
namespace {

const char* name_of(nn::Bf16Gemm choice) { return choice == nn::Bf16Gemm::native ? "native" : "widened"; }

std::string spelled(nn::Bf16Gemm choice) {
  return choice == nn::Bf16Gemm::native ? "ATen's bf16 kernel (native)" : "widened fp32 GEMMs (widened)";
}

}  // namespace

bool runs_bf16_gemms(const JobConfig& config, const at::Device& device) {
  const auto& converters = config.model.converters;
  const bool float8 = std::find(converters.begin(), converters.end(), "float8") != converters.end();
  return (config.training.dtype == DType::bfloat16 ||
          mixed_precision_param(config.training, device.is_cuda()) == DType::bfloat16) &&
         !(float8 && !device.is_cuda());
}

RunState current_run_state(const JobConfig& config, const at::Device& device) {
  if (device.is_cuda() || !runs_bf16_gemms(config, device)) return {};
  return {.bf16_gemm = nn::bf16_gemm()};
}

RunState settle_run_state(const JobConfig& config, const at::Device& device, const dist::ProcessGroup& world,
                          const std::filesystem::path& run_dir) {
  RunState state;
  if (!device.is_cuda() && runs_bf16_gemms(config, device)) {
    log::info("{}", nn::describe_bf16_gemm());
    // One kernel on every rank, rank 0's: each rank's own timing could differ under load, the slow form would
    // set the pace of every collective, and the ranks' numbers would differ by a bf16 ulp per GEMM.
    const nn::Bf16Gemm own = nn::bf16_gemm();
    if (nn::use_rank0_bf16_gemm(world)) {
      log::info_all("bf16 GEMMs on CPU: this rank chose {}; it runs rank 0's, {}", spelled(own),
                    spelled(nn::bf16_gemm()));
    }
    state.bf16_gemm = nn::bf16_gemm();
  }
  if (world.rank() == 0) {
    nlohmann::json record = run_state_json(state);
    record["bf16_gemm_why"] = state.bf16_gemm ? nn::describe_bf16_gemm() : "the job's GEMMs are not bf16 on CPU";
    checkpoint::write_file_atomically(run_dir / "run_state.json", record.dump(2) + "\n");
  }
  return state;
}

nlohmann::json run_state_json(const RunState& state) {
  return {{"bf16_gemm", state.bf16_gemm ? nlohmann::json(name_of(*state.bf16_gemm)) : nlohmann::json(nullptr)}};
}

std::optional<std::string> run_state_change(const nlohmann::json& train_state, const RunState& now) {
  const auto recorded = train_state.find("bf16_gemm");
  if (recorded == train_state.end() || !recorded->is_string() || !now.bf16_gemm) return std::nullopt;
  const std::string was = recorded->get<std::string>();
  if (was == name_of(*now.bf16_gemm)) return std::nullopt;
  const std::string how = was == "native" || was == "widened" ? fmt::format("TITAN_BF16_GEMM={}", was)
                                                              : "TITAN_BF16_GEMM=native or widened";
  return fmt::format(
      "The checkpoint was trained with bf16 GEMMs on CPU as '{}' (train_state.bf16_gemm); this run runs {}. Each "
      "GEMM may differ from the checkpoint's kernel by one bf16 ulp, so the run continues within bf16 rounding of, "
      "not bitwise as, the one that saved it. Set {} to run the checkpoint's kernel (at this CPU's speed for it).",
      was, spelled(*now.bf16_gemm), how);
}

}  // namespace titan
