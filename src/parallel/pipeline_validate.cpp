// SPDX-License-Identifier: BSD-3-Clause
// Checking a pipeline program before it runs, and simulating it. The checks go from local to global:
// shape (stages, ranks, ranges), duplicates and completeness, what each action needs earlier in its
// own rank's program (an input that has not arrived is a bug even if timing would hide it), that
// sends and receives pair up in order between every two ranks, and last a simulation in which a
// receive blocks its rank until the matching send is posted: a state where every unfinished rank
// waits is a deadlock, reported rank by rank.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "pipeline_internal.hpp"
#include "titan/core/error.hpp"

namespace titan::parallel {
namespace {

using Op = PipelineAction::Op;
using detail::is_recv;
using detail::is_send;
constexpr int64_t kNowhere = -1;

PipelineAction with(Op op, int64_t stage, int64_t microbatch) {
  return {.op = op, .stage = stage, .microbatch = microbatch};
}

/// The send a receive waits for.
PipelineAction send_of(const PipelineAction& recv) {
  return recv.op == Op::kRecvForward ? with(Op::kSendForward, recv.stage - 1, recv.microbatch)
                                     : with(Op::kSendBackward, recv.stage + 1, recv.microbatch);
}
/// The receive a send is for.
PipelineAction recv_of(const PipelineAction& send) {
  return send.op == Op::kSendForward ? with(Op::kRecvForward, send.stage + 1, send.microbatch)
                                     : with(Op::kRecvBackward, send.stage - 1, send.microbatch);
}

/// Where every action sits: its step in its rank's program (kNowhere when absent).
class Positions {
 public:
  explicit Positions(const PipelineProgram& program)
      : m_(program.num_microbatches),
        step_(static_cast<size_t>(program.num_stages * detail::kOps * program.num_microbatches), kNowhere) {}
  int64_t& operator[](const PipelineAction& a) { return step_[static_cast<size_t>(detail::action_index(a, m_))]; }
  int64_t step(const PipelineAction& a) const { return step_[static_cast<size_t>(detail::action_index(a, m_))]; }
  bool has(const PipelineAction& a) const { return step(a) != kNowhere; }

 private:
  int64_t m_;
  std::vector<int64_t> step_;
};

struct Checker {
  const PipelineProgram& p;
  const std::string where = detail::where(p);
  Positions at{p};

  int64_t rank_of(int64_t stage) const { return p.stage_rank[static_cast<size_t>(stage)]; }
  int64_t last() const { return p.num_stages - 1; }
  std::string stages_of(int64_t rank) const {
    std::vector<int64_t> stages;
    for (int64_t s = 0; s < p.num_stages; ++s) {
      if (rank_of(s) == rank) stages.push_back(s);
    }
    return fmt::format("{}", fmt::join(stages, ", "));
  }
  /// "1F0 (step 3)" or "1F0 (nowhere)".
  std::string located(const PipelineAction& a) const {
    return at.has(a) ? fmt::format("{} (rank {} step {})", format_as(a), rank_of(a.stage), at.step(a))
                     : fmt::format("{} (in no rank's program)", format_as(a));
  }

  void duplicates_and_completeness() {
    for (int64_t rank = 0; rank < p.num_ranks; ++rank) {
      const auto& actions = p.actions[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < static_cast<int64_t>(actions.size()); ++step) {
        const PipelineAction& a = actions[static_cast<size_t>(step)];
        TITAN_CHECK_VALUE(!at.has(a),
                          "{} rank {} step {} ({}): expected each action once, got it again (first at step {}). "
                          "Remove one of them.",
                          where, rank, step, format_as(a), at.step(a));
        at[a] = step;
      }
    }
    for (int64_t s = 0; s < p.num_stages; ++s) {
      const int64_t rank = rank_of(s);
      for (int64_t mb = 0; mb < p.num_microbatches; ++mb) {
        const PipelineAction f = with(Op::kForward, s, mb);
        const PipelineAction b = with(Op::kBackward, s, mb);
        const PipelineAction i = with(Op::kBackwardInput, s, mb);
        const PipelineAction w = with(Op::kBackwardWeight, s, mb);
        TITAN_CHECK_VALUE(at.has(f),
                          "{} rank {}: expected the forward of microbatch {} on stage {} ({}), got none. "
                          "Add {} to rank {}'s row.",
                          where, rank, mb, s, format_as(f), format_as(f), rank);
        TITAN_CHECK_VALUE(!(at.has(b) && (at.has(i) || at.has(w))),
                          "{} rank {} step {} ({}): expected either a full backward or {} + {}, got both. Remove one.",
                          where, rank, at.step(b), format_as(b), format_as(i), format_as(w));
        TITAN_CHECK_VALUE(at.has(b) || at.has(i) || at.has(w),
                          "{} rank {}: expected a backward of microbatch {} on stage {} ({}, or {} and {}), got none. "
                          "Add it to rank {}'s row.",
                          where, rank, mb, s, format_as(b), format_as(i), format_as(w), rank);
        TITAN_CHECK_VALUE(at.has(b) || (at.has(i) && at.has(w)),
                          "{} rank {}: expected both halves of the backward of microbatch {} on stage {}, got {} "
                          "without {}. Add it to rank {}'s row.",
                          where, rank, mb, s, format_as(at.has(i) ? i : w), format_as(at.has(i) ? w : i), rank);
      }
    }
  }

  /// Every send has its receive and the other way round.
  void pairs() {
    for (int64_t rank = 0; rank < p.num_ranks; ++rank) {
      const auto& actions = p.actions[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < static_cast<int64_t>(actions.size()); ++step) {
        const PipelineAction& a = actions[static_cast<size_t>(step)];
        if (is_send(a.op)) {
          const PipelineAction r = recv_of(a);
          TITAN_CHECK_VALUE(at.has(r),
                            "{} rank {} step {} ({}): expected rank {} to receive it ({}), got no such "
                            "receive. Add {} to rank {}'s row before the compute that needs it, or remove the send.",
                            where, rank, step, format_as(a), rank_of(r.stage), format_as(r), format_as(r),
                            rank_of(r.stage));
        } else if (is_recv(a.op)) {
          const PipelineAction s = send_of(a);
          TITAN_CHECK_VALUE(at.has(s),
                            "{} rank {} step {} ({}): expected rank {} to send it ({}), got no such send; "
                            "the receive would wait forever. Add {} to rank {}'s row after the compute that produces "
                            "it, or remove the receive.",
                            where, rank, step, format_as(a), rank_of(s.stage), format_as(s), format_as(s),
                            rank_of(s.stage));
        }
      }
    }
  }

  /// What each action needs earlier in its own rank's program.
  void local_order() {
    for (int64_t rank = 0; rank < p.num_ranks; ++rank) {
      const auto& actions = p.actions[static_cast<size_t>(rank)];
      for (int64_t step = 0; step < static_cast<int64_t>(actions.size()); ++step) {
        const PipelineAction& a = actions[static_cast<size_t>(step)];
        const auto before = [&](const PipelineAction& x) {
          return at.has(x) && at.step(x) < step && rank_of(x.stage) == rank;
        };
        // Throws: none of `options` runs before this step on this rank.
        const auto missing = [&](const std::vector<PipelineAction>& options, std::string_view what) {
          std::vector<std::string> names;
          for (const PipelineAction& x : options) names.push_back(format_as(x));
          std::string got = "none before it";
          std::string fix = fmt::format("Add {} before step {}", names.back(), step);
          for (const PipelineAction& x : options) {
            if (!at.has(x) || rank_of(x.stage) != rank) continue;
            got = fmt::format("{} only at step {}, after it", format_as(x), at.step(x));
            fix = fmt::format("Move {} after {}", format_as(a), format_as(x));
          }
          TITAN_CHECK_VALUE(false, "{} rank {} step {} ({}): expected {} earlier on rank {} ({}), got {}. {}.", where,
                            rank, step, format_as(a), what, rank, fmt::join(names, " or "), got, fix);
        };
        const int64_t s = a.stage;
        const int64_t mb = a.microbatch;
        switch (a.op) {
          case Op::kForward:
            if (s == 0) break;
            if (rank_of(s - 1) == rank) {
              if (!before(with(Op::kForward, s - 1, mb))) missing({with(Op::kForward, s - 1, mb)}, "its input");
            } else if (!before(with(Op::kRecvForward, s, mb))) {
              missing({with(Op::kRecvForward, s, mb)}, "its input to have arrived");
            }
            break;
          case Op::kBackward:
          case Op::kBackwardInput:
            if (!before(with(Op::kForward, s, mb))) missing({with(Op::kForward, s, mb)}, "its forward");
            if (s == last()) break;
            if (rank_of(s + 1) == rank) {
              const PipelineAction b = with(Op::kBackward, s + 1, mb);
              const PipelineAction i = with(Op::kBackwardInput, s + 1, mb);
              if (!before(b) && !before(i)) missing({b, i}, "the gradient of its output");
            } else if (!before(with(Op::kRecvBackward, s, mb))) {
              missing({with(Op::kRecvBackward, s, mb)}, "the gradient of its output to have arrived");
            }
            break;
          case Op::kBackwardWeight:
            if (!before(with(Op::kBackwardInput, s, mb)))
              missing({with(Op::kBackwardInput, s, mb)}, "its input-gradient half");
            break;
          case Op::kSendForward:
            if (!before(with(Op::kForward, s, mb))) missing({with(Op::kForward, s, mb)}, "the forward it sends");
            break;
          case Op::kSendBackward:
            if (!before(with(Op::kBackward, s, mb)) && !before(with(Op::kBackwardInput, s, mb))) {
              missing({with(Op::kBackward, s, mb), with(Op::kBackwardInput, s, mb)}, "the backward it sends");
            }
            break;
          case Op::kRecvForward:
          case Op::kRecvBackward:
            break;
        }
      }
    }
  }

  /// Between two ranks, the receiver takes messages in the order the sender posts them: p2p
  /// messages carry no tag, so an out-of-order receive would silently take the wrong tensor (every
  /// stage boundary has the same activation shape).
  void channel_mirror() const;

  void channel_order() {
    const auto ranks = static_cast<size_t>(p.num_ranks);
    std::vector<std::vector<std::vector<PipelineAction>>> sent(ranks, std::vector<std::vector<PipelineAction>>(ranks));
    for (size_t src = 0; src < ranks; ++src) {
      for (const PipelineAction& a : p.actions[src]) {
        if (is_send(a.op)) sent[src][static_cast<size_t>(rank_of(recv_of(a).stage))].push_back(a);
      }
    }
    for (size_t dst = 0; dst < ranks; ++dst) {
      std::vector<size_t> next(ranks, 0);
      const auto& actions = p.actions[dst];
      for (int64_t step = 0; step < static_cast<int64_t>(actions.size()); ++step) {
        const PipelineAction& a = actions[static_cast<size_t>(step)];
        if (!is_recv(a.op)) continue;
        const PipelineAction s = send_of(a);
        const auto src = static_cast<size_t>(rank_of(s.stage));
        const PipelineAction& expected = sent[src][dst][next[src]++];
        TITAN_CHECK_VALUE(expected == s,
                          "{} rank {} step {} ({}): expected the receives from rank {} in the order it "
                          "sends them (messages between two ranks are matched in order), got {} before {}, which "
                          "rank {} sends first (its step {}). Receive {} first.",
                          where, dst, step, format_as(a), src, format_as(a), format_as(recv_of(expected)), src,
                          at.step(expected), format_as(recv_of(expected)));
      }
    }
  }
};

/// NCCL matches the operations of two ranks in the order each posts them, whatever they are, and a send
/// waits until its receive is posted: both ranks must post their sends and receives to each other in the
/// same order (one's send where the other receives), or each waits for the other.
void Checker::channel_mirror() const {
  const auto ranks = static_cast<size_t>(p.num_ranks);
  // Per ordered pair (me, peer): the messages in me's posting order, a message named by its send.
  std::vector<std::vector<std::vector<std::pair<PipelineAction, int64_t>>>> posts(
      ranks, std::vector<std::vector<std::pair<PipelineAction, int64_t>>>(ranks));
  for (size_t r = 0; r < ranks; ++r) {
    const auto& actions = p.actions[r];
    for (int64_t step = 0; step < static_cast<int64_t>(actions.size()); ++step) {
      const PipelineAction& a = actions[static_cast<size_t>(step)];
      if (!is_send(a.op) && !is_recv(a.op)) continue;
      const PipelineAction message = is_send(a.op) ? a : send_of(a);
      const PipelineAction other = is_send(a.op) ? recv_of(a) : send_of(a);
      posts[r][static_cast<size_t>(rank_of(other.stage))].emplace_back(message, step);
    }
  }
  for (size_t a = 0; a < ranks; ++a) {
    for (size_t b = a + 1; b < ranks; ++b) {
      const auto& mine = posts[a][b];
      const auto& theirs = posts[b][a];
      for (size_t n = 0; n < std::min(mine.size(), theirs.size()); ++n) {
        if (mine[n].first == theirs[n].first) continue;
        const auto post = [&](size_t rank, const std::pair<PipelineAction, int64_t>& m) {
          const PipelineAction& action = p.actions[rank][static_cast<size_t>(m.second)];
          return fmt::format("{} (step {})", format_as(action), m.second);
        };
        TITAN_CHECK_VALUE(false,
                          "{} expected ranks {} and {} to post their sends and receives to each other in the same "
                          "order (NCCL matches them in posting order and a send waits for its receive), got rank {}'s "
                          "operation #{} {} against rank {}'s {}: on GPUs the two would wait for each other. Let "
                          "add_pipeline_communication place them, or reorder them by hand.",
                          where, a, b, a, n, post(a, mine[n]), b, post(b, theirs[n]));
      }
    }
  }
}

/// Runs the program: each rank in order, a receive blocking until its send is posted. Records the
/// compute times into `timeline` and each send's time into `sent` (by action index) when given; throws
/// naming every blocked rank on a deadlock. `mirrored`: also require NCCL's posting order.
void run(const PipelineProgram& p, const PipelineCosts& costs, PipelineTimeline* timeline,
         std::vector<double>* sent = nullptr, bool mirrored = true) {
  Checker checker{p};
  checker.duplicates_and_completeness();
  checker.pairs();
  checker.local_order();
  checker.channel_order();

  const auto ranks = static_cast<size_t>(p.num_ranks);
  std::vector<size_t> pc(ranks, 0);
  std::vector<double> clock(ranks, 0.0);
  std::vector<double> posted(p.stage_rank.size() * detail::kOps * static_cast<size_t>(p.num_microbatches),
                             std::numeric_limits<double>::quiet_NaN());
  if (timeline) timeline->assign(ranks, {});
  const auto cost = [&](Op op) {
    switch (op) {
      case Op::kForward:
        return costs.forward;
      case Op::kBackward:
        return costs.backward;
      case Op::kBackwardInput:
        return costs.backward_input;
      case Op::kBackwardWeight:
        return costs.backward_weight;
      default:
        return 0.0;
    }
  };
  const auto index = [&](const PipelineAction& a) {
    return static_cast<size_t>(detail::action_index(a, p.num_microbatches));
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < ranks; ++r) {
      const auto& actions = p.actions[r];
      for (; pc[r] < actions.size(); ++pc[r], progress = true) {
        const PipelineAction& a = actions[pc[r]];
        if (is_recv(a.op)) {
          const double sent_at = posted[index(send_of(a))];
          if (std::isnan(sent_at)) break;  // blocked until the peer gets there
          clock[r] = std::max(clock[r], sent_at + costs.transfer);
        } else if (is_send(a.op)) {
          posted[index(a)] = clock[r];
        } else {
          const double start = clock[r];
          clock[r] += cost(a.op);
          if (timeline) (*timeline)[r].push_back({.action = a, .start = start, .end = clock[r]});
        }
      }
    }
  }
  std::vector<std::string> blocked;
  for (size_t r = 0; r < ranks; ++r) {
    if (pc[r] == p.actions[r].size()) continue;
    const PipelineAction& a = p.actions[r][pc[r]];
    const PipelineAction s = send_of(a);
    const auto peer = static_cast<size_t>(checker.rank_of(s.stage));
    blocked.push_back(
        fmt::format("rank {} step {} ({}) waits for {} from rank {} (its step {}){}", r, pc[r], format_as(a),
                    format_as(s), peer, checker.at.step(s),
                    pc[peer] < p.actions[peer].size() ? fmt::format(", which is stuck at step {}", pc[peer]) : ""));
  }
  TITAN_CHECK_VALUE(blocked.empty(),
                    "{} expected every rank to finish, got a deadlock: {}. Reorder the programs so "
                    "that each send comes before anything its sender waits for that depends on the receiver.",
                    checker.where, fmt::join(blocked, "; "));
  // Last: a program that deadlocks even with Gloo's tagged sends is reported as the deadlock it is.
  if (mirrored) checker.channel_mirror();
  if (sent) *sent = std::move(posted);
}

}  // namespace

namespace detail {

std::vector<double> send_times(const PipelineProgram& program) {
  check_structure(program);
  std::vector<double> sent;
  run(program, PipelineCosts{}, nullptr, &sent, /*mirrored=*/false);
  return sent;
}

void check_structure(const PipelineProgram& p) {
  const std::string where = detail::where(p);
  TITAN_CHECK_VALUE(p.num_ranks >= 1 && p.num_stages >= 1 && p.num_microbatches >= 1,
                    "{} expected at least one rank, stage and microbatch, got {} ranks, {} stages, {} microbatches.",
                    where, p.num_ranks, p.num_stages, p.num_microbatches);
  TITAN_CHECK_VALUE(static_cast<int64_t>(p.actions.size()) == p.num_ranks,
                    "{} expected a program row per rank ({}), got {} rows. Give every pp rank a row.", where,
                    p.num_ranks, p.actions.size());
  TITAN_CHECK_VALUE(static_cast<int64_t>(p.stage_rank.size()) == p.num_stages,
                    "{} expected a rank for each of the {} stages, got {}.", where, p.num_stages, p.stage_rank.size());
  for (int64_t s = 0; s < p.num_stages; ++s) {
    const int64_t r = p.stage_rank[static_cast<size_t>(s)];
    TITAN_CHECK_VALUE(r >= 0 && r < p.num_ranks, "{} expected stage {} on a rank in [0, {}), got rank {}.", where, s,
                      p.num_ranks, r);
  }
  const auto rank_of = [&](int64_t stage) { return p.stage_rank[static_cast<size_t>(stage)]; };
  for (int64_t rank = 0; rank < p.num_ranks; ++rank) {
    const auto& actions = p.actions[static_cast<size_t>(rank)];
    for (int64_t step = 0; step < static_cast<int64_t>(actions.size()); ++step) {
      const PipelineAction& a = actions[static_cast<size_t>(step)];
      TITAN_CHECK_VALUE(
          a.stage >= 0 && a.stage < p.num_stages && a.microbatch >= 0 && a.microbatch < p.num_microbatches,
          "{} rank {} step {} ({}): expected a stage in [0, {}) and a microbatch in [0, {}), got stage {} "
          "microbatch {}. Fix the action, or the pp degree and microbatch count.",
          where, rank, step, format_as(a), p.num_stages, p.num_microbatches, a.stage, a.microbatch);
      TITAN_CHECK_VALUE(rank_of(a.stage) == rank,
                        "{} rank {} step {} ({}): expected only actions of rank {}'s stages, got stage {}, which "
                        "runs on rank {}. Move it to rank {}'s row.",
                        where, rank, step, format_as(a), rank, a.stage, rank_of(a.stage), rank_of(a.stage));
      const bool forward_comm = a.op == Op::kSendForward || a.op == Op::kRecvBackward;   // toward stage + 1
      const bool backward_comm = a.op == Op::kRecvForward || a.op == Op::kSendBackward;  // toward stage - 1
      if (!forward_comm && !backward_comm) continue;
      const int64_t peer = forward_comm ? a.stage + 1 : a.stage - 1;
      TITAN_CHECK_VALUE(peer >= 0 && peer < p.num_stages,
                        "{} rank {} step {} ({}): expected a peer stage, got none (stage {} is the {} stage). Remove "
                        "it.",
                        where, rank, step, format_as(a), a.stage, forward_comm ? "last" : "first");
      TITAN_CHECK_VALUE(rank_of(peer) != rank,
                        "{} rank {} step {} ({}): expected communication only between stages on different ranks, got "
                        "stages {} and {} both on rank {} (they hand tensors over locally). Remove it.",
                        where, rank, step, format_as(a), a.stage, peer, rank);
    }
  }
  check_overlapped(p);
}

void check_overlapped(const PipelineProgram& p) {
  if (p.overlapped.empty()) return;
  const std::string where = detail::where(p);
  TITAN_CHECK_VALUE(static_cast<int64_t>(p.overlapped.size()) == p.num_ranks,
                    "{} expected a row of overlapped pairs per rank ({}), got {} rows.", where, p.num_ranks,
                    p.overlapped.size());
  const auto peer_rank = [&](const PipelineAction& a) {
    const bool toward_next = a.op == Op::kSendForward || a.op == Op::kRecvBackward;
    return p.stage_rank[static_cast<size_t>(toward_next ? a.stage + 1 : a.stage - 1)];
  };
  for (int64_t rank = 0; rank < p.num_ranks; ++rank) {
    const auto& actions = p.actions[static_cast<size_t>(rank)];
    for (const OverlappedPair& pair : p.overlapped[static_cast<size_t>(rank)]) {
      const PipelineAction &f = pair.forward, &b = pair.backward;
      const auto at = std::find(actions.begin(), actions.end(), f);
      auto next = at == actions.end()
                      ? at
                      : std::find_if(at + 1, actions.end(), [](const PipelineAction& a) { return a.is_compute(); });
      // The backward of the forward's own microbatch on the forward's stage or an earlier one needs the
      // forward's result; only an independent backward can run beside it.
      const bool independent = f.microbatch != b.microbatch || f.stage < b.stage;
      TITAN_CHECK_VALUE(
          f.op == Op::kForward && b.op == Op::kBackward && independent && next != actions.end() && *next == b,
          "{} rank {}: expected an overlapped pair to be a forward followed, as the next compute "
          "action of the rank, by an independent full backward, got ({};{}). Fix the pair.",
          where, rank, format_as(f), format_as(b));
      // An overlapping runtime posts the backward's own receive before the forward runs, ahead of the
      // communication between the two: NCCL matches a pair of ranks' operations in posting order, so none
      // of what it overtakes may be with the same rank.
      const PipelineAction receive{.op = Op::kRecvBackward, .stage = b.stage, .microbatch = b.microbatch};
      const auto recv = std::find(at + 1, next, receive);
      for (auto a = at + 1; a != recv && recv != next; ++a) {
        TITAN_CHECK_VALUE(peer_rank(*a) != peer_rank(*recv),
                          "{} rank {}: expected the overlapped pair ({};{}) to have no communication with rank {} "
                          "before its backward's receive, got {}. Move the receive before the forward.",
                          where, rank, format_as(f), format_as(b), peer_rank(*recv), format_as(*a));
      }
    }
  }
}

}  // namespace detail

void validate_pipeline_program(const PipelineProgram& program) {
  detail::check_structure(program);
  run(program, PipelineCosts{}, nullptr);
}

PipelineTimeline simulate_pipeline(const PipelineProgram& program, const PipelineCosts& costs) {
  detail::check_structure(program);
  PipelineTimeline timeline;
  run(program, costs, &timeline);
  return timeline;
}

}  // namespace titan::parallel
