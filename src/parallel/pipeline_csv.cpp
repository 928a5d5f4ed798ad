// SPDX-License-Identifier: BSD-3-Clause
// torchtitan's CSV schedules (parallelism.pipeline_parallel_schedule_csv): a row per pp rank, a
// cell per action in torchtitan's notation ("0F0", "2I1", "1SEND_F0"); blank cells are ignored.
// UNSHARD / RESHARD / REDUCE_GRAD cells (PyTorch's FSDP actions) are skipped: titan's data
// parallelism does that work itself.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "pipeline_internal.hpp"
#include "titan/core/error.hpp"

namespace titan::parallel {
namespace {

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

bool is_fsdp_action(std::string_view cell) {
  const auto op = cell.find_first_not_of("0123456789");
  if (op == std::string_view::npos) return false;
  const std::string_view name = cell.substr(op);
  return name.starts_with("UNSHARD") || name.starts_with("RESHARD") || name.starts_with("REDUCE_GRAD");
}

}  // namespace

PipelineProgram read_pipeline_csv(const std::filesystem::path& csv, int64_t pp, int64_t microbatches) {
  std::ifstream in(csv);
  TITAN_CHECK_VALUE(in.good(),
                    "[titan::pipeline] expected a readable CSV schedule at '{}', got none. Check "
                    "parallelism.pipeline_parallel_schedule_csv.",
                    csv.string());
  PipelineProgram program{
      .name = fmt::format("csv:{}", csv.filename().string()), .num_ranks = pp, .num_microbatches = microbatches};
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();  // trailing newlines
  TITAN_CHECK_VALUE(static_cast<int64_t>(lines.size()) == pp,
                    "[titan::pipeline] {}: expected {} rows (one per pp rank), got {}. Write one row per rank or "
                    "change parallelism.pipeline_parallel_degree.",
                    csv.string(), pp, lines.size());
  bool has_comm = false;
  int64_t stages = 0;
  for (size_t row = 0; row < lines.size(); ++row) {
    auto& actions = program.actions.emplace_back();
    std::istringstream cells(lines[row]);
    size_t column = 0;
    for (std::string cell; std::getline(cells, cell, ','); ++column) {
      const std::string_view text = trim(cell);
      if (text.empty() || is_fsdp_action(text)) continue;
      try {
        actions.push_back(parse_pipeline_action(text));
      } catch (const c10::ValueError& e) {
        TITAN_CHECK_VALUE(false, "[titan::pipeline] {} row {} (rank {}) cell {}: {}", csv.string(), row + 1, row,
                          column + 1, e.what_without_backtrace());
      }
      has_comm = has_comm || !actions.back().is_compute();
      stages = std::max(stages, actions.back().stage + 1);
    }
  }
  // A stage lives where its forward runs (or, lacking one, any of its actions).
  program.num_stages = stages;
  program.stage_rank.assign(static_cast<size_t>(stages), -1);
  for (const bool forwards_only : {true, false}) {
    for (size_t rank = 0; rank < program.actions.size(); ++rank) {
      for (const PipelineAction& a : program.actions[rank]) {
        if (forwards_only && a.op != PipelineAction::Op::kForward) continue;
        int64_t& owner = program.stage_rank[static_cast<size_t>(a.stage)];
        TITAN_CHECK_VALUE(!forwards_only || owner == -1 || owner == static_cast<int64_t>(rank),
                          "[titan::pipeline] {}: expected stage {} to run its forwards on one rank, got rank {} and "
                          "rank {} ({}). Keep each stage's actions in one row.",
                          csv.string(), a.stage, owner, rank, format_as(a));
        if (owner == -1) owner = static_cast<int64_t>(rank);
      }
    }
  }
  for (int64_t s = 0; s < stages; ++s) {
    TITAN_CHECK_VALUE(program.stage_rank[static_cast<size_t>(s)] != -1,
                      "[titan::pipeline] {}: expected actions for every stage 0..{}, got none for stage {}. Add its "
                      "forwards and backwards.",
                      csv.string(), stages - 1, s);
  }
  if (has_comm) {
    detail::check_structure(program);
  } else {
    add_pipeline_communication(program);
  }
  return program;
}

}  // namespace titan::parallel
