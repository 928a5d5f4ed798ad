// SPDX-License-Identifier: BSD-3-Clause
// Private: the pieces behind parallel/pipeline_schedule.hpp shared by its source files: the
// compute-only orders of the built-in schedules (pipeline_generators.cpp) and a dense index of
// (stage, op, microbatch) for the validator and the simulator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/parallel/pipeline_schedule.hpp"

namespace titan::parallel::detail {

/// Per rank, compute actions in execution order (no sends or receives yet).
using RankOrders = std::vector<std::vector<PipelineAction>>;

/// GPipe: every forward, then every backward, microbatches in order.
RankOrders gpipe_order(int64_t pp, int64_t microbatches);
/// 1F1B: pp-1-rank warm-up forwards, then one forward and one backward, then the remaining backwards.
RankOrders one_f_one_b_order(int64_t pp, int64_t microbatches);
/// Megatron's interleaved 1F1B on looped stages; with zero_bubble, backwards are split into I and W
/// and each rank delays its W's by `rank` backwards so that they fill the cool-down bubble.
RankOrders interleaved_order(int64_t pp, int64_t stages, int64_t microbatches, bool zero_bubble);
/// Breadth-first: all microbatches through each local stage before the next (backward in reverse).
RankOrders looped_bfs_order(int64_t pp, int64_t stages, int64_t microbatches);
/// ZB-V (zero-bubble paper, section 6) on V-placed stages.
RankOrders zbv_order(int64_t pp, int64_t microbatches);
/// DualPipeV (DeepSeek's DualPipe folded into a V). Its overlapped F/B pairs are in the order as F
/// then B; when `overlapped` is given it receives them per rank (PipelineProgram::overlapped).
RankOrders dual_pipe_v_order(int64_t pp, int64_t microbatches,
                             std::vector<std::vector<OverlappedPair>>* overlapped = nullptr);

/// Dense index of an action: ((stage * kOps) + op) * microbatches + microbatch.
inline bool is_send(PipelineAction::Op op) {
  return op == PipelineAction::Op::kSendForward || op == PipelineAction::Op::kSendBackward;
}
inline bool is_recv(PipelineAction::Op op) {
  return op == PipelineAction::Op::kRecvForward || op == PipelineAction::Op::kRecvBackward;
}

inline constexpr int64_t kOps = 8;
inline int64_t action_index(const PipelineAction& a, int64_t microbatches) {
  return (a.stage * kOps + static_cast<int64_t>(a.op)) * microbatches + a.microbatch;
}

/// Throws unless the program's shape is sound: a row per rank, stage_rank covering the stages,
/// every action's stage and microbatch in range and on its stage's rank, sends and receives only
/// between stages on different ranks, overlapped pairs as check_overlapped wants them. Everything
/// else may assume these.
void check_structure(const PipelineProgram& program);
/// Throws unless each overlapped pair is a forward followed (as the rank's next compute) by an
/// independent full backward, and the backward's receive, when it lies between them, overtakes no
/// communication with its peer (an overlapping runtime posts it before the forward).
void check_overlapped(const PipelineProgram& program);

/// When each send is posted in a simulation of a valid program (by action_index; NaN for absent actions),
/// without requiring NCCL's posting order yet. Throws what validate_pipeline_program would.
std::vector<double> send_times(const PipelineProgram& program);

/// The message prefix naming the program: "[titan::pipeline] 1F1B: ".
std::string where(const PipelineProgram& program);

}  // namespace titan::parallel::detail
