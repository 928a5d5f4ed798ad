// SPDX-License-Identifier: BSD-3-Clause
// Inserting the sends and receives of a compute-only program. A send goes right after the compute
// that produces the tensor; a receive goes right before the compute that consumes it, preceded by
// the receives of any message its sender posted earlier on the same pair of ranks: point-to-point
// messages between two ranks are matched in the order they are posted (NCCL has no tags), so every
// rank receives in the order its peer sends. Those extra receives never wait longer than the one
// needed, since the sender posted them first.
#include <algorithm>
#include <optional>
#include <set>
#include <tuple>

#include "pipeline_internal.hpp"

namespace titan::parallel {
namespace {

using Op = PipelineAction::Op;

struct Links {
  const PipelineProgram& program;
  int64_t rank_of(int64_t stage) const { return program.stage_rank[static_cast<size_t>(stage)]; }
  int64_t last() const { return program.num_stages - 1; }
  bool is_backward(Op op) const { return op == Op::kBackward || op == Op::kBackwardInput; }

  /// The send after `a`, when its output goes to a stage on another rank.
  std::optional<PipelineAction> send_after(const PipelineAction& a) const {
    if (a.op == Op::kForward && a.stage != last() && rank_of(a.stage + 1) != rank_of(a.stage)) {
      return PipelineAction{.op = Op::kSendForward, .stage = a.stage, .microbatch = a.microbatch};
    }
    if (is_backward(a.op) && a.stage != 0 && rank_of(a.stage - 1) != rank_of(a.stage)) {
      return PipelineAction{.op = Op::kSendBackward, .stage = a.stage, .microbatch = a.microbatch};
    }
    return std::nullopt;
  }
  /// The receive before `a`, when its input comes from a stage on another rank.
  std::optional<PipelineAction> recv_before(const PipelineAction& a) const {
    if (a.op == Op::kForward && a.stage != 0 && rank_of(a.stage - 1) != rank_of(a.stage)) {
      return PipelineAction{.op = Op::kRecvForward, .stage = a.stage, .microbatch = a.microbatch};
    }
    if (is_backward(a.op) && a.stage != last() && rank_of(a.stage + 1) != rank_of(a.stage)) {
      return PipelineAction{.op = Op::kRecvBackward, .stage = a.stage, .microbatch = a.microbatch};
    }
    return std::nullopt;
  }
  /// The receive that matches a send, and the rank it runs on.
  PipelineAction recv_of(const PipelineAction& send) const {
    return send.op == Op::kSendForward
               ? PipelineAction{.op = Op::kRecvForward, .stage = send.stage + 1, .microbatch = send.microbatch}
               : PipelineAction{.op = Op::kRecvBackward, .stage = send.stage - 1, .microbatch = send.microbatch};
  }
};

/// Orders actions for std::set.
struct Less {
  bool operator()(const PipelineAction& a, const PipelineAction& b) const {
    return std::tuple(a.stage, a.op, a.microbatch) < std::tuple(b.stage, b.op, b.microbatch);
  }
};
using ActionSet = std::set<PipelineAction, Less>;

}  // namespace

void add_pipeline_communication(PipelineProgram& program) {
  detail::check_structure(program);
  const Links links{program};
  const auto ranks = static_cast<size_t>(program.num_ranks);
  // Sends, right after their producer (unless the program already has them).
  for (auto& actions : program.actions) {
    ActionSet present(actions.begin(), actions.end());
    std::vector<PipelineAction> out;
    for (const PipelineAction& a : actions) {
      out.push_back(a);
      if (!a.is_compute()) continue;
      if (auto send = links.send_after(a); send && present.insert(*send).second) out.push_back(*send);
    }
    actions = std::move(out);
  }
  // What each rank sends each other rank, in its order: the order the receiver must follow.
  std::vector<std::vector<std::vector<PipelineAction>>> channel(ranks, std::vector<std::vector<PipelineAction>>(ranks));
  for (size_t src = 0; src < ranks; ++src) {
    for (const PipelineAction& a : program.actions[src]) {
      if (a.op != Op::kSendForward && a.op != Op::kSendBackward) continue;
      const PipelineAction recv = links.recv_of(a);
      channel[src][static_cast<size_t>(links.rank_of(recv.stage))].push_back(recv);
    }
  }
  for (size_t dst = 0; dst < ranks; ++dst) {
    auto& actions = program.actions[dst];
    const ActionSet present(actions.begin(), actions.end());
    ActionSet received;
    std::vector<size_t> cursor(ranks, 0);
    std::vector<PipelineAction> out;
    for (const PipelineAction& a : actions) {
      const std::optional<PipelineAction> recv = a.is_compute() ? links.recv_before(a) : std::nullopt;
      if (recv && !received.contains(*recv) && !present.contains(*recv)) {
        const int64_t peer_stage = recv->op == Op::kRecvForward ? recv->stage - 1 : recv->stage + 1;
        const auto src = static_cast<size_t>(links.rank_of(peer_stage));
        const auto& sent = channel[src][dst];
        const bool is_sent =
            std::find(sent.begin() + static_cast<std::ptrdiff_t>(cursor[src]), sent.end(), *recv) != sent.end();
        // Receive everything the peer sent before it first; with no send at all, the lone receive
        // is left for the validator to report.
        while (is_sent && cursor[src] < sent.size()) {
          const PipelineAction& next = sent[cursor[src]++];
          if (!received.contains(next) && !present.contains(next)) {
            out.push_back(next);
            received.insert(next);
          }
          if (next == *recv) break;
        }
        if (!is_sent) out.push_back(*recv), received.insert(*recv);
      }
      if (!a.is_compute()) received.insert(a);
      out.push_back(a);
    }
    actions = std::move(out);
  }
}

}  // namespace titan::parallel
