// SPDX-License-Identifier: BSD-3-Clause
// Inserting the sends and receives of a compute-only program. A send goes right after the compute
// that produces the tensor; a receive goes right before the compute that consumes it, preceded by
// the receives of any message its sender posted earlier on the same pair of ranks: point-to-point
// messages between two ranks are matched in the order they are posted (NCCL has no tags), so every
// rank receives in the order its peer sends. Those extra receives never wait longer than the one
// needed, since the sender posted them first.
//
// Last, the two ranks of a pair are made to post their sends and receives to each other in one order:
// NCCL matches a pair's operations in posting order and a send waits for its receive, so one rank sending
// while the other first receives something else hangs. The order is the order of the sends in a simulation
// of the program, and only receives move (earlier), so no send waits for data and no compute moves.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "pipeline_internal.hpp"

namespace titan::parallel {
namespace {

using Op = PipelineAction::Op;
using detail::is_recv;
using detail::is_send;

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

/// Where a communication action of a rank goes: the peer rank, and the message as its send names it.
struct Message {
  int64_t peer;
  PipelineAction send;
};

/// Reorders every rank's communication so that each pair of ranks posts it in the same order (above).
/// Leaves a program it cannot simulate as it is, for the validator to report.
void order_for_nccl(PipelineProgram& program) {
  const Links links{program};
  std::vector<double> sent;
  try {
    sent = detail::send_times(program);
  } catch (const c10::Error&) {
    return;
  }
  const auto ranks = static_cast<size_t>(program.num_ranks);
  const auto message_of = [&](size_t rank, const PipelineAction& a) {
    const PipelineAction send =
        is_send(a.op) ? a
        : a.op == Op::kRecvForward
            ? PipelineAction{.op = Op::kSendForward, .stage = a.stage - 1, .microbatch = a.microbatch}
            : PipelineAction{.op = Op::kSendBackward, .stage = a.stage + 1, .microbatch = a.microbatch};
    const PipelineAction recv = links.recv_of(send);
    const int64_t peer =
        static_cast<size_t>(links.rank_of(send.stage)) == rank ? links.rank_of(recv.stage) : links.rank_of(send.stage);
    return Message{.peer = peer, .send = send};
  };
  const auto key = [](const PipelineAction& s) {
    return std::tuple(static_cast<int64_t>(s.op), s.stage, s.microbatch);
  };
  const auto time_of = [&](const PipelineAction& send) {
    return sent[static_cast<size_t>(detail::action_index(send, program.num_microbatches))];
  };
  // Per rank and peer: the messages in program order, and which are this rank's sends.
  std::vector<std::map<int64_t, std::vector<PipelineAction>>> posts(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    for (const PipelineAction& a : program.actions[r]) {
      if (!is_send(a.op) && !is_recv(a.op)) continue;
      const Message m = message_of(r, a);
      posts[r][m.peer].push_back(m.send);
    }
  }
  // Per pair: merge the two directions by send time. A message may go next once its sender has placed every
  // receive it posts before that send (receives only move earlier); a valid program always has one.
  std::vector<std::map<int64_t, std::vector<PipelineAction>>> order(ranks);
  for (size_t a = 0; a < ranks; ++a) {
    for (const auto& [peer, mine] : posts[a]) {
      const auto b = static_cast<size_t>(peer);
      if (b < a) continue;
      const auto& theirs = posts[b][static_cast<int64_t>(a)];
      std::set<std::tuple<int64_t, int64_t, int64_t>> placed;  // (op, stage, microbatch) of placed messages
      // The next send of `side`, once every receive before it in side's program is placed. `skip` moves
      // past side's placed prefix for good, so a pair's merge is linear in its messages (a planner's
      // search walks programs of thousands of microbatches).
      const auto next_send = [&](const std::vector<PipelineAction>& side, size_t sender,
                                 size_t& skip) -> std::optional<PipelineAction> {
        while (skip < side.size() && placed.contains(key(side[skip]))) ++skip;
        if (skip == side.size()) return std::nullopt;
        const PipelineAction& s = side[skip];
        const bool own = static_cast<size_t>(links.rank_of(s.stage)) == sender;
        if (own) return s;
        return std::nullopt;  // a receive not placed yet comes first in side's program
      };
      size_t skip_mine = 0, skip_theirs = 0;
      std::vector<PipelineAction> merged;
      const size_t total = mine.size();
      while (merged.size() < total) {
        const std::optional<PipelineAction> x = next_send(mine, a, skip_mine), y = next_send(theirs, b, skip_theirs);
        if (!x && !y) return;  // cannot happen for a program the simulation ran through
        const bool take_x = x && (!y || std::pair(time_of(*x), a) <= std::pair(time_of(*y), b));
        const PipelineAction pick = take_x ? *x : *y;
        placed.insert(key(pick));
        merged.push_back(pick);
      }
      order[a][peer] = merged;
      order[b][static_cast<int64_t>(a)] = merged;
    }
  }
  // Rebuild each rank's program: computes stay; a communication action brings every earlier message of its
  // pair's order first (all receives, by construction).
  for (size_t r = 0; r < ranks; ++r) {
    std::map<int64_t, size_t> cursor;
    std::set<std::tuple<int64_t, int64_t, int64_t>> done;
    std::vector<PipelineAction> out;
    const auto action_for = [&](const PipelineAction& send) {
      return static_cast<size_t>(links.rank_of(send.stage)) == r ? send : links.recv_of(send);
    };
    for (const PipelineAction& a : program.actions[r]) {
      if (!is_send(a.op) && !is_recv(a.op)) {
        out.push_back(a);
        continue;
      }
      const Message m = message_of(r, a);
      if (done.contains(key(m.send))) continue;
      const auto& merged = order[r][m.peer];
      size_t& c = cursor[m.peer];
      while (c < merged.size()) {
        const PipelineAction& next = merged[c++];
        done.insert(key(next));
        out.push_back(action_for(next));
        if (next == m.send) break;
      }
    }
    program.actions[r] = std::move(out);
  }
}

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
  order_for_nccl(program);
}

}  // namespace titan::parallel
