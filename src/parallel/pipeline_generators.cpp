// SPDX-License-Identifier: BSD-3-Clause
// The compute order of each built-in schedule, per rank. Orders follow the published schedules (and
// PyTorch's torch.distributed.pipelining for the details each paper leaves open); they carry no
// idle slots: the runtime waits for inputs, so only the order matters. Sends and receives are added
// afterwards (pipeline_comm.cpp) and every program is validated before it is returned.
#include <algorithm>
#include <deque>
#include <map>

#include "pipeline_internal.hpp"

namespace titan::parallel::detail {
namespace {

using Op = PipelineAction::Op;

/// Hands out microbatch indices in order, per (stage, op).
class Counter {
 public:
  PipelineAction next(int64_t stage, Op op) {
    int64_t& n = next_[{stage, static_cast<int>(op)}];
    return {.op = op, .stage = stage, .microbatch = n++};
  }

 private:
  std::map<std::pair<int64_t, int>, int64_t> next_;
};

}  // namespace

RankOrders gpipe_order(int64_t pp, int64_t microbatches) {
  RankOrders orders(static_cast<size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) {
    auto& order = orders[static_cast<size_t>(rank)];
    for (int64_t mb = 0; mb < microbatches; ++mb)
      order.push_back({.op = Op::kForward, .stage = rank, .microbatch = mb});
    for (int64_t mb = 0; mb < microbatches; ++mb) {
      order.push_back({.op = Op::kBackward, .stage = rank, .microbatch = mb});
    }
  }
  return orders;
}

RankOrders one_f_one_b_order(int64_t pp, int64_t microbatches) {
  RankOrders orders(static_cast<size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) {
    auto& order = orders[static_cast<size_t>(rank)];
    // A rank keeps pp - rank microbatches in flight: the later ranks' forwards must be running
    // before the first backward comes back.
    const int64_t warmup = std::min(pp - 1 - rank, microbatches);
    int64_t forward = 0;
    int64_t backward = 0;
    for (; forward < warmup; ++forward) order.push_back({.op = Op::kForward, .stage = rank, .microbatch = forward});
    while (backward < microbatches) {
      if (forward < microbatches) order.push_back({.op = Op::kForward, .stage = rank, .microbatch = forward++});
      order.push_back({.op = Op::kBackward, .stage = rank, .microbatch = backward++});
    }
  }
  return orders;
}

RankOrders interleaved_order(int64_t pp, int64_t stages, int64_t microbatches, bool zero_bubble) {
  const int64_t local_stages = stages / pp;
  const int64_t rounds = std::max<int64_t>(1, microbatches / pp);
  const int64_t per_round = microbatches / rounds;
  const int64_t total = local_stages * microbatches;  // forwards (and backwards) per rank
  RankOrders orders(static_cast<size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) {
    // The k-th forward of this rank runs local stage (k / per_round) % v: a round of microbatches
    // through stage 0, then the same round through stage 1, ... (depth first); backwards mirror it
    // from the last local stage.
    const auto forward_stage = [&](int64_t k) { return ((k / per_round) % local_stages) * pp + rank; };
    const auto backward_stage = [&](int64_t k) {
      return (local_stages - 1 - (k / per_round) % local_stages) * pp + rank;
    };
    // Megatron's warm-up: the later local stages of one round, plus 2 per hop to the last rank (the
    // forward and the backward must both travel); zero bubble needs only 1 per hop since its I's are shorter.
    const int64_t per_hop = zero_bubble ? 1 : 2;
    const int64_t warmup = std::min((local_stages - 1) * per_round + per_hop * (pp - 1 - rank), total);
    Counter counter;
    std::vector<PipelineAction> backwards;
    int64_t weights = 0;
    auto& order = orders[static_cast<size_t>(rank)];
    const Op backward_op = zero_bubble ? Op::kBackwardInput : Op::kBackward;
    for (int64_t k = 0; k < warmup; ++k) order.push_back(counter.next(forward_stage(k), Op::kForward));
    for (int64_t k = 0; k < total; ++k) {
      if (warmup + k < total) order.push_back(counter.next(forward_stage(warmup + k), Op::kForward));
      backwards.push_back(counter.next(backward_stage(k), backward_op));
      order.push_back(backwards.back());
      // ZB-H1: rank r holds its first r W's back; they run in the cool-down, where 1F1B idles.
      if (zero_bubble && k >= rank) {
        order.push_back({.op = Op::kBackwardWeight,
                         .stage = backwards[weights].stage,
                         .microbatch = backwards[weights].microbatch});
        ++weights;
      }
    }
    for (; zero_bubble && weights < total; ++weights) {
      order.push_back(
          {.op = Op::kBackwardWeight, .stage = backwards[weights].stage, .microbatch = backwards[weights].microbatch});
    }
  }
  return orders;
}

RankOrders looped_bfs_order(int64_t pp, int64_t stages, int64_t microbatches) {
  RankOrders orders(static_cast<size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) {
    auto& order = orders[static_cast<size_t>(rank)];
    for (int64_t stage = rank; stage < stages; stage += pp) {
      for (int64_t mb = 0; mb < microbatches; ++mb)
        order.push_back({.op = Op::kForward, .stage = stage, .microbatch = mb});
    }
    // The last microbatch through the last stage is the first whose gradient is ready.
    for (int64_t stage = stages - pp + rank; stage >= 0; stage -= pp) {
      for (int64_t mb = microbatches - 1; mb >= 0; --mb) {
        order.push_back({.op = Op::kBackward, .stage = stage, .microbatch = mb});
      }
    }
  }
  return orders;
}

RankOrders zbv_order(int64_t pp, int64_t microbatches) {
  // The steady state needs 2pp-1 microbatches in flight; with fewer, the order is built for 2pp-1
  // and the phantom microbatches are dropped (their slots become waits).
  const int64_t n = std::max(2 * pp - 1, microbatches);
  RankOrders orders(static_cast<size_t>(pp));
  for (int64_t rank = 0; rank < pp; ++rank) {
    const int64_t down = rank;             // chunk 0: the stage on the way down the V
    const int64_t up = 2 * pp - 1 - rank;  // chunk 1: the stage on the way back up
    Counter c;
    std::vector<PipelineAction> order;
    int64_t f0 = 0, f1 = 0;
    const auto f_down = [&] { order.push_back(c.next(down, Op::kForward)), ++f0; };
    const auto f_up = [&] { order.push_back(c.next(up, Op::kForward)), ++f1; };
    const auto iw = [&](int64_t stage) {
      order.push_back(c.next(stage, Op::kBackwardInput));
      order.push_back(c.next(stage, Op::kBackwardWeight));
    };
    // Warm-up: fill the down leg (deeper ranks start later), then alternate down/up forwards until
    // the first up-leg gradient returns; the up stage's first backwards start at once.
    for (int64_t k = 0; k < 2 * (pp - rank) - 1; ++k) f_down();
    for (int64_t k = 0; k < rank; ++k) f_up(), f_down();
    for (int64_t k = 0; k < pp - rank; ++k) f_up(), iw(up);
    // Steady: F(down) I W(down) F(up) I W(up), one microbatch at a time on each leg.
    while (f1 < f0 || f0 < n) {
      if (f0 < n) f_down();
      iw(down);
      f_up();
      iw(up);
    }
    // Cool-down: the remaining I's first (they unblock the other ranks); the W's they leave behind
    // fill the gaps, oldest first.
    std::deque<PipelineAction> down_weights, up_weights;
    const auto input_only = [&](int64_t stage) {
      order.push_back(c.next(stage, Op::kBackwardInput));
      (stage == down ? down_weights : up_weights).push_back(c.next(stage, Op::kBackwardWeight));
    };
    for (int64_t k = 0; k < rank; ++k) input_only(down), input_only(up);
    for (int64_t k = 0; k < pp - rank; ++k) {
      input_only(down);
      order.push_back(down_weights.front());
      down_weights.pop_front();
    }
    for (const PipelineAction& w : up_weights) order.push_back(w);
    for (const PipelineAction& w : down_weights) order.push_back(w);
    auto& kept = orders[static_cast<size_t>(rank)];
    for (const PipelineAction& a : order) {
      if (a.microbatch < microbatches) kept.push_back(a);
    }
  }
  return orders;
}

RankOrders dual_pipe_v_order(int64_t pp, int64_t microbatches, std::vector<std::vector<OverlappedPair>>* overlapped) {
  RankOrders orders(static_cast<size_t>(pp));
  if (overlapped) overlapped->assign(static_cast<size_t>(pp), {});
  for (int64_t rank = 0; rank < pp; ++rank) {
    const int64_t down = rank;
    const int64_t up = 2 * pp - 1 - rank;
    std::map<std::pair<int64_t, int>, int64_t> next;  // (stage, F or backward) -> next microbatch
    std::deque<PipelineAction> pending_weights;       // W's of the I's run so far, oldest first
    auto& order = orders[static_cast<size_t>(rank)];
    const auto forward = [&](int64_t stage) {
      order.push_back({.op = Op::kForward, .stage = stage, .microbatch = next[{stage, 0}]++});
    };
    // Full backward and I share one counter: a microbatch gets one or the other.
    const auto backward = [&](int64_t stage, bool split) {
      const int64_t mb = next[{stage, 1}]++;
      order.push_back({.op = split ? Op::kBackwardInput : Op::kBackward, .stage = stage, .microbatch = mb});
      if (split) pending_weights.push_back({.op = Op::kBackwardWeight, .stage = stage, .microbatch = mb});
    };
    const auto weight = [&] {
      if (pending_weights.empty()) return;
      order.push_back(pending_weights.front());
      pending_weights.pop_front();
    };
    // DualPipe overlaps a forward of one leg with a backward of the other: listed as F then B (what a
    // sequential runtime runs) and marked as a pair for a runtime that overlaps them.
    const auto overlapped_pair = [&](int64_t forward_stage, int64_t backward_stage) {
      forward(forward_stage);
      backward(backward_stage, /*split=*/false);
      if (overlapped) overlapped->at(static_cast<size_t>(rank)).push_back({order[order.size() - 2], order.back()});
    };
    for (int64_t k = 0; k < 2 * (pp - rank - 1); ++k) forward(down);
    for (int64_t k = 0; k < rank + 1; ++k) forward(down), forward(up);
    for (int64_t k = 0; k < pp - rank - 1; ++k) backward(up, /*split=*/true), weight(), forward(up);
    const int64_t main_steps = microbatches - 2 * pp + rank + 1;
    for (int64_t k = 0; k < main_steps; ++k) {
      overlapped_pair(down, up);
      overlapped_pair(up, down);
    }
    for (int64_t k = 0; k < pp - rank - 1; ++k) backward(up, /*split=*/false), overlapped_pair(up, down);
    // The second half of the cool-down splits backwards so that W's fill the drain.
    bool split = false;
    for (int64_t k = 0; k < rank + 1; ++k) {
      if (k == (rank + 1) / 2 && rank % 2 == 1) split = true;
      backward(up, split);
      if (k == (rank + 1) / 2 && rank % 2 == 0) split = true;
      backward(down, split);
    }
    for (int64_t k = 0; k < pp - rank - 1; ++k) weight(), backward(down, split);
    while (!pending_weights.empty()) weight();
  }
  return orders;
}

}  // namespace titan::parallel::detail
