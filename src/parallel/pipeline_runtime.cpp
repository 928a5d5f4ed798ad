// SPDX-License-Identifier: BSD-3-Clause
// Executes one rank's program for one batch. Each (stage, microbatch) pair keeps its input, output
// and gradients until its backward is done. Sends and receives are posted when their actions come, in
// the program's order, which add_pipeline_communication made the same on both ranks of a pair (NCCL's
// rule); a send is waited for at the end of the step, so a rank never blocks on its own sends. The first
// receive across a boundary learns its shape from a small message the sender posts right before the
// tensor, so it blocks there until the sender has computed it.
//
// An overlapped pair (PipelineProgram::overlapped, DualPipeV's F/B pairs) runs its backward on a second
// thread while the forward runs on the rank's: the backward's receives are posted before the forward
// starts, the forward's sends as soon as it ends, the backward's sends once it is done. The halves are
// different microbatches, so their autograd graphs share only the parameters' gradient accumulators
// (which autograd locks), and the backward accumulates into .grad in the order it would alone. Thread-
// local modes stay with their half: the forward's WeightGradScope (split backward) and the backward's
// checkpoint recompute each see only their own thread's. Only the rank's thread posts or waits on the pp
// group, except the backward thread waiting for its own, already posted, receive; stages whose layers
// issue collectives (TP, CP, FSDP, EP) never get here (PipelineState::overlap_f_b).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "pipeline_state.hpp"
#include "titan/core/error.hpp"
#include "titan/nn/attention_context.hpp"
#include "titan/nn/split_backward.hpp"

namespace titan::parallel {
namespace {

using Op = PipelineAction::Op;
using Clock = std::chrono::steady_clock;

// Boundary shape message: ndim, dtype, then up to kMaxDims sizes.
constexpr int64_t kMaxDims = 8;

enum class Channel : int64_t { kActivation = 0, kGradient = 1, kMeta = 2 };

struct Slot {
  at::Tensor input;        // what the stage's forward received (a leaf requiring grad, except stage 0)
  at::Tensor output;       // the stage output (the scaled loss on the last stage); graph alive until backward
  at::Tensor output_grad;  // gradient of output (from the next stage)
  at::Tensor input_grad;   // gradient of input (for the previous stage)
  // A split schedule's weight gradients this microbatch's input pass left (nn/split_backward.hpp).
  std::shared_ptr<nn::WeightGradQueue> weight_grads;
  bool forward_done = false;
  bool input_grad_done = false;
  bool weight_grad_pending = false;  // input pass done, weight pass not yet
};

struct PendingRecv {
  at::Tensor buffer;
  dist::Work work;
};

// The second thread of a rank's overlapped pairs: runs one task at a time (a pair's backward) with the
// rank thread's intra-op thread count (a different count may sum in another order, and the pair must give
// the sequential bits) and thread-local state as the rank thread had it when the task was handed over.
class PairThread {
 public:
  PairThread() : intra_op_threads_(at::get_num_threads()), thread_([this] { loop(); }) {}
  ~PairThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();  // a running task finishes first: it uses the step's slots
  }
  PairThread(const PairThread&) = delete;
  PairThread& operator=(const PairThread&) = delete;

  void start(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      task_ = std::move(task);
      state_.emplace();
      busy_ = true;
    }
    wake_.notify_all();
  }
  // Waits for the task; rethrows what it threw.
  void finish() {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    at::set_num_threads(intra_op_threads_);
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return busy_ || stop_; });
      if (!busy_) return;
      lock.unlock();
      std::exception_ptr error;
      try {
        const at::ThreadLocalStateGuard modes(*state_);
        task_();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      task_ = nullptr;
      busy_ = false;
      wake_.notify_all();
    }
  }

  int intra_op_threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> task_;
  std::optional<at::ThreadLocalState> state_;  // the rank thread's, captured by start()
  std::exception_ptr error_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

class StepRunner {
 public:
  StepRunner(detail::PipelineState& state, const PipelineProgram& program, const StageForward& forward, LossFn loss,
             double scale, bool train)
      : s_(state), program_(program), forward_(forward), loss_(std::move(loss)), scale_(scale), train_(train) {
    for (const auto& row : program_.actions) {
      for (const PipelineAction& a : row) split_ = split_ || (train_ && a.op == Op::kBackwardWeight);
    }
    if (train_ && s_.overlap_f_b && !program_.overlapped.empty()) {
      for (const OverlappedPair& pair : program_.overlapped[static_cast<size_t>(s_.rank())]) {
        paired_backward_.emplace(key(pair.forward.op, pair.forward.stage, pair.forward.microbatch), pair.backward);
      }
    }
  }

  double run(const at::Tensor& tokens, const at::Tensor& labels, const nn::AttentionContext& context) {
    const int64_t micro = program_.num_microbatches;
    if (s_.is_local(0)) tokens_ = tokens.chunk(micro, 0);
    if (s_.is_local(s_.num_stages() - 1)) labels_ = labels.chunk(micro, 0);
    device_ = s_.device = tokens.device();
    rows_ = tokens.size(0) / micro;
    context_ = context;  // the caller's batch; each microbatch runs with its rows
    tokens_per_row_ = tokens.numel() / std::max<int64_t>(tokens.size(0), 1);
    s_.timeline.assign(static_cast<size_t>(program_.num_ranks), {});
    s_.stats = {};
    start_ = Clock::now();
    const auto& actions = program_.actions[static_cast<size_t>(s_.rank())];
    for (size_t i = 0; i < actions.size(); ++i) {
      try {
        const auto paired = paired_backward_.find(key(actions[i].op, actions[i].stage, actions[i].microbatch));
        if (paired == paired_backward_.end()) {
          execute(actions[i]);
        } else {
          i = execute_pair(actions, i, paired->second);
        }
      } catch (c10::Error& e) {
        e.add_context(fmt::format("[titan::pipeline] while running action {} ({}) of pp rank {}'s program {}", i,
                                  actions[i], s_.rank(), program_.name));
        throw;
      }
    }
    for (auto& [work, tensor] : sends_) work.wait();
    sends_.clear();
    for (const auto& [key, slot] : slots_) {
      TITAN_CHECK(!train_ || (!slot.output.defined() && !slot.weight_grad_pending),
                  "[titan::pipeline] expected every microbatch's backward done at the end of the step, got stage {} "
                  "microbatch {} still holding its activations. The schedule misses its backward.",
                  key.first, key.second);
    }
    return loss_sum_;
  }

 private:
  static int64_t seconds_ns(Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  int64_t tag(Channel channel, int64_t stage, int64_t microbatch) const {
    return (static_cast<int64_t>(channel) * s_.num_stages() + stage) * program_.num_microbatches + microbatch;
  }
  detail::PipelineState::BoundaryKey boundary(int64_t stage) const { return {stage, rows_, tokens_per_row_}; }
  int64_t rank_of(int64_t stage) const { return s_.stage_rank[static_cast<size_t>(stage)]; }
  Slot& slot(int64_t stage, int64_t microbatch) { return slots_[{stage, microbatch}]; }

  void execute(const PipelineAction& a) {
    switch (a.op) {
      case Op::kRecvForward:
      case Op::kRecvBackward:
        post_recv(a);
        return;
      case Op::kSendForward:
        send_activation(a);
        return;
      case Op::kSendBackward:
        send(slot(a.stage, a.microbatch).input_grad, rank_of(a.stage - 1),
             tag(Channel::kGradient, a.stage - 1, a.microbatch));
        return;
      default:
        break;
    }
    // The action's clock starts once its input is here: waiting for a neighbour is bubble, not work.
    if (a.op == Op::kForward) {
      Slot& sl = slot(a.stage, a.microbatch);
      if (!sl.forward_done && !sl.input.defined()) sl.input = stage_input(a.stage, a.microbatch);
    } else if (a.op != Op::kBackwardWeight && slot(a.stage, a.microbatch).forward_done) {
      output_grad(a.stage, a.microbatch);
    }
    const auto begin = Clock::now();
    switch (a.op) {
      case Op::kForward:
        forward(a.stage, a.microbatch);
        break;
      case Op::kBackward:
        backward(a.stage, a.microbatch, /*input_only=*/false);
        break;
      case Op::kBackwardInput:
        backward(a.stage, a.microbatch, /*input_only=*/true);
        break;
      case Op::kBackwardWeight:
        backward_weight(a.stage, a.microbatch);
        break;
      default:
        break;
    }
    record(a, begin, Clock::now());
  }

  void record(const PipelineAction& a, Clock::time_point begin, Clock::time_point end) {
    s_.timeline[static_cast<size_t>(s_.rank())].push_back(
        {.action = a, .start = seconds_since_start(begin), .end = seconds_since_start(end)});
  }
  double seconds_since_start(Clock::time_point t) const { return static_cast<double>(seconds_ns(t - start_)) * 1e-9; }

  // Runs actions[first] (a forward) and its paired backward at the same time, with the communication
  // between them; returns the backward's index. The backward's sends follow it in the program and run
  // as usual once both halves are done.
  size_t execute_pair(const std::vector<PipelineAction>& actions, size_t first, const PipelineAction& b) {
    const PipelineAction& f = actions[first];
    size_t last = first + 1;
    while (last < actions.size() && !actions[last].is_compute()) ++last;
    TITAN_CHECK(last < actions.size() && actions[last] == b,
                "[titan::pipeline] expected {}'s overlapped backward {} to be the next compute action, got {}. The "
                "program's overlapped pairs do not match its actions.",
                f, b, last < actions.size() ? format_as(actions[last]) : std::string("the end of the program"));
    // The backward's receive first: its output gradient travels while the forward computes (the
    // validator made sure it overtakes nothing with the same peer, so per-peer posting order is kept).
    const PipelineAction receive{.op = Op::kRecvBackward, .stage = b.stage, .microbatch = b.microbatch};
    const auto early = std::find(actions.begin() + static_cast<ptrdiff_t>(first) + 1,
                                 actions.begin() + static_cast<ptrdiff_t>(last), receive);
    if (early != actions.begin() + static_cast<ptrdiff_t>(last)) post_recv(*early);
    Slot& fs = slot(f.stage, f.microbatch);
    if (!fs.forward_done && !fs.input.defined()) fs.input = stage_input(f.stage, f.microbatch);

    Slot& bs = slot(b.stage, b.microbatch);
    check_backward(bs, b.stage, b.microbatch);
    // The output gradient as far as the rank's thread can have it without waiting: a local hand-over,
    // else the posted receive the backward thread waits for.
    std::optional<PendingRecv> incoming;
    if (b.stage != s_.num_stages() - 1 && !bs.output_grad.defined()) {
      if (s_.is_local(b.stage + 1)) {
        output_grad(b.stage, b.microbatch);
      } else {
        auto it = recvs_.find(key(Op::kRecvBackward, b.stage, b.microbatch));
        TITAN_CHECK(it != recvs_.end(),
                    "[titan::pipeline] expected a RECV_B receive for stage {} microbatch {} before its compute, got "
                    "none. Add the receive to the program.",
                    b.stage, b.microbatch);
        incoming = std::move(it->second);
        recvs_.erase(it);
      }
    }
    // The backward thread touches only bs (and `incoming`, `waited`, `b_begin`): never the slot map,
    // the stats or the timeline, which the rank's thread owns.
    double waited = 0;
    Clock::time_point b_begin;
    if (!pair_thread_) pair_thread_.emplace();
    pair_thread_->start([&, stage = b.stage] {
      if (incoming) {
        const auto wait_begin = Clock::now();
        incoming->work.wait();
        waited = static_cast<double>(seconds_ns(Clock::now() - wait_begin)) * 1e-9;
        bs.output_grad = std::move(incoming->buffer);
      }
      b_begin = Clock::now();
      run_backward(bs, stage, /*input_only=*/false);
    });
    std::exception_ptr forward_error;
    try {
      const auto f_begin = Clock::now();
      forward(f.stage, f.microbatch);
      record(f, f_begin, Clock::now());
      // The rest of the communication between the two, in program order, while the backward computes.
      for (size_t i = first + 1; i < last; ++i) {
        if (actions[i] != receive) execute(actions[i]);
      }
    } catch (...) {
      forward_error = std::current_exception();
    }
    pair_thread_->finish();  // first: the backward uses bs and the locals above
    if (forward_error) std::rethrow_exception(forward_error);
    const auto b_end = Clock::now();
    s_.stats.wait_seconds += waited;
    if (bs.output_grad.defined() && incoming) s_.stats.bytes_moved += bs.output_grad.nbytes();
    finish_backward(bs, /*input_only=*/false);
    record(b, b_begin, b_end);
    ++s_.stats.overlapped_pairs;
    return last;
  }

  // --- communication -------------------------------------------------------------------------

  std::tuple<Op, int64_t, int64_t> key(Op op, int64_t stage, int64_t microbatch) const {
    return {op, stage, microbatch};
  }

  void send(const at::Tensor& t, int64_t dst, int64_t tg) {
    TITAN_CHECK(t.defined(),
                "[titan::pipeline] expected a tensor to send to pp rank {}, got none. The program sends "
                "before computing it.",
                dst);
    at::Tensor data = t.detach().contiguous();
    s_.stats.bytes_moved += data.nbytes();
    sends_.emplace_back(s_.group.send(data, dst, tg), data);
  }

  void send_activation(const PipelineAction& a) {
    const Slot& sl = slot(a.stage, a.microbatch);
    const int64_t dst = rank_of(a.stage + 1);
    if (s_.meta_sent.insert(boundary(a.stage + 1)).second) {
      const at::Tensor& out = sl.output;
      TITAN_CHECK_VALUE(out.dim() <= kMaxDims, "[titan::pipeline] expected stage outputs of at most {} dims, got {}.",
                        kMaxDims, out.dim());
      at::Tensor meta = at::zeros({kMaxDims + 2}, at::kLong);  // (ndim, dtype, sizes...)
      meta[0] = out.dim();
      meta[1] = static_cast<int64_t>(out.scalar_type());
      for (int64_t d = 0; d < out.dim(); ++d) meta[d + 2] = out.size(d);
      send(meta.to(out.device()), dst, tag(Channel::kMeta, a.stage + 1, 0));
    }
    send(sl.output, dst, tag(Channel::kActivation, a.stage + 1, a.microbatch));
  }

  // The buffer a receive lands in.
  at::Tensor recv_buffer(Op op, int64_t stage, int64_t microbatch) {
    if (op == Op::kRecvBackward) {
      const Slot& sl = slot(stage, microbatch);
      TITAN_CHECK(sl.output.defined(),
                  "[titan::pipeline] expected stage {} microbatch {}'s forward before the receive of its output's "
                  "gradient, got the receive first. Reorder the program.",
                  stage, microbatch);
      return at::empty_like(sl.output, at::MemoryFormat::Contiguous);
    }
    learn_input_shape(stage);
    const detail::BoundaryMeta& meta = s_.input_meta.at(boundary(stage));
    return at::empty(meta.sizes, at::TensorOptions().dtype(meta.dtype).device(device_));
  }

  void post_recv(const PipelineAction& a) {
    PendingRecv& r = recvs_[key(a.op, a.stage, a.microbatch)];
    r.buffer = recv_buffer(a.op, a.stage, a.microbatch);
    const bool fwd = a.op == Op::kRecvForward;
    r.work = s_.group.recv(r.buffer, rank_of(fwd ? a.stage - 1 : a.stage + 1),
                           tag(fwd ? Channel::kActivation : Channel::kGradient, a.stage, a.microbatch));
  }

  void learn_input_shape(int64_t stage) {
    if (s_.input_meta.contains(boundary(stage))) return;
    at::Tensor meta = at::zeros({kMaxDims + 2}, at::TensorOptions().dtype(at::kLong).device(device_));
    s_.group.recv(meta, rank_of(stage - 1), tag(Channel::kMeta, stage, 0)).wait();
    meta = meta.cpu();
    detail::BoundaryMeta m{.dtype = static_cast<at::ScalarType>(meta[1].item<int64_t>())};
    for (int64_t d = 0; d < meta[0].item<int64_t>(); ++d) m.sizes.push_back(meta[d + 2].item<int64_t>());
    s_.input_meta[boundary(stage)] = std::move(m);
  }

  at::Tensor wait_recv(Op op, int64_t stage, int64_t microbatch) {
    auto it = recvs_.find(key(op, stage, microbatch));
    TITAN_CHECK(it != recvs_.end(),
                "[titan::pipeline] expected a {} receive for stage {} microbatch {} before its compute, got none. "
                "Add the receive to the program.",
                op == Op::kRecvForward ? "RECV_F" : "RECV_B", stage, microbatch);
    const auto begin = Clock::now();
    it->second.work.wait();
    s_.stats.wait_seconds += static_cast<double>(seconds_ns(Clock::now() - begin)) * 1e-9;
    s_.stats.bytes_moved += it->second.buffer.nbytes();
    at::Tensor out = std::move(it->second.buffer);
    recvs_.erase(it);
    return out;
  }

  // --- compute -------------------------------------------------------------------------------

  at::Tensor stage_input(int64_t stage, int64_t microbatch) {
    if (stage == 0) return tokens_[static_cast<size_t>(microbatch)];
    at::Tensor x = s_.is_local(stage - 1) ? slot(stage - 1, microbatch).output.detach()
                                          : wait_recv(Op::kRecvForward, stage, microbatch);
    if (train_) x.requires_grad_(true);
    return x;
  }

  void forward(int64_t stage, int64_t microbatch) {
    Slot& sl = slot(stage, microbatch);
    TITAN_CHECK(!sl.forward_done, "[titan::pipeline] expected one forward of stage {} microbatch {}, got two.", stage,
                microbatch);
    c10::AutoGradMode grad_mode(train_);
    // Under a split schedule the layers record their weight gradients as deferrable into this
    // microbatch's queue; its input pass leaves them there for the weight pass.
    if (split_) sl.weight_grads = std::make_shared<nn::WeightGradQueue>();
    const nn::WeightGradScope record(sl.weight_grads);
    at::Tensor y = forward_(stage, sl.input, context_.rows(microbatch * rows_, rows_));
    if (stage == s_.num_stages() - 1) {
      const at::Tensor loss = loss_(y, labels_[static_cast<size_t>(microbatch)].to(y.device())) * scale_;  // ()
      loss_sum_ += loss.detach().item<double>();
      y = loss;
    }
    sl.output = std::move(y);
    sl.forward_done = true;
    if (!train_) sl.input = at::Tensor();
    int64_t live = 0;
    for (const auto& [k, other] : slots_) live += other.output.defined() && train_ ? 1 : 0;
    s_.stats.max_in_flight = std::max(s_.stats.max_in_flight, live);
  }

  // Gradient of this stage's output: from the next stage (received, or handed over on this rank).
  at::Tensor output_grad(int64_t stage, int64_t microbatch) {
    Slot& sl = slot(stage, microbatch);
    if (stage == s_.num_stages() - 1 || sl.output_grad.defined()) return sl.output_grad;
    sl.output_grad = s_.is_local(stage + 1) ? slot(stage + 1, microbatch).input_grad
                                            : wait_recv(Op::kRecvBackward, stage, microbatch);
    TITAN_CHECK(sl.output_grad.defined(),
                "[titan::pipeline] expected stage {} microbatch {}'s backward to follow stage {}'s, got it first. "
                "Reorder the program.",
                stage, microbatch, stage + 1);
    return sl.output_grad;
  }

  void backward(int64_t stage, int64_t microbatch, bool input_only) {
    Slot& sl = slot(stage, microbatch);
    check_backward(sl, stage, microbatch);
    output_grad(stage, microbatch);
    run_backward(sl, stage, input_only);
    finish_backward(sl, input_only);
  }

  static void check_backward(const Slot& sl, int64_t stage, int64_t microbatch) {
    TITAN_CHECK(sl.forward_done && sl.output.defined() && !sl.input_grad_done,
                "[titan::pipeline] expected one backward of stage {} microbatch {} after its forward, got {}.", stage,
                microbatch, sl.forward_done ? "a second one" : "none before it");
  }

  // The autograd pass, given the slot's output gradient (undefined on the last stage: the loss). Touches
  // only the slot: an overlapped pair runs it on the pair's second thread.
  static void run_backward(Slot& sl, int64_t stage, bool input_only) {
    const torch::autograd::variable_list grads =
        sl.output_grad.defined() ? torch::autograd::variable_list{sl.output_grad} : torch::autograd::variable_list{};
    {
      // Zero-bubble's first half is the whole backward with the layers' weight GEMMs deferred: what cannot
      // defer (embeddings, biases) computes its weight gradient here, and the graph is released.
      std::optional<nn::InputGradPass> defer;
      if (input_only && sl.weight_grads) defer.emplace(*sl.weight_grads);
      torch::autograd::backward({sl.output}, grads);
    }
    if (stage > 0) sl.input_grad = sl.input.grad();
  }

  static void finish_backward(Slot& sl, bool input_only) {
    release(sl);
    sl.weight_grad_pending = input_only;
    sl.input_grad_done = true;
  }

  void backward_weight(int64_t stage, int64_t microbatch) {
    Slot& sl = slot(stage, microbatch);
    TITAN_CHECK(sl.input_grad_done && sl.weight_grad_pending,
                "[titan::pipeline] expected stage {} microbatch {}'s weight gradient after its input gradient, got "
                "it {}.",
                stage, microbatch, sl.input_grad_done ? "twice" : "first");
    // Only the deferred weight GEMMs and reductions: no activation gradient is computed again.
    if (sl.weight_grads) sl.weight_grads->run_weight_grads();
    sl.weight_grads.reset();
    sl.weight_grad_pending = false;
  }

  static void release(Slot& sl) {
    sl.output = at::Tensor();
    sl.input = at::Tensor();
    sl.output_grad = at::Tensor();
  }

  detail::PipelineState& s_;
  const PipelineProgram& program_;
  const StageForward& forward_;
  LossFn loss_;  // a copy: callers pass temporaries
  double scale_;
  bool train_;
  bool split_ = false;  // the program splits backward ('I' then 'W'): forwards record deferrable weight grads
  at::Device device_ = at::kCPU;
  int64_t rows_ = 0, tokens_per_row_ = 0;  // a microbatch's token shape: keys the boundary shapes
  nn::AttentionContext context_;           // the batch's attention context (positions, documents, cp split)
  std::vector<at::Tensor> tokens_, labels_;
  std::map<std::pair<int64_t, int64_t>, Slot> slots_;
  std::map<std::tuple<Op, int64_t, int64_t>, PendingRecv> recvs_;
  std::vector<std::pair<dist::Work, at::Tensor>> sends_;
  // This rank's overlapped pairs by their forward (empty when the pairs run one after the other).
  std::map<std::tuple<Op, int64_t, int64_t>, PipelineAction> paired_backward_;
  Clock::time_point start_;
  double loss_sum_ = 0;
  std::optional<PairThread> pair_thread_;  // last: joined before the slots its task uses go
};

int64_t microbatches_of(const at::Tensor& tokens, const PipelinePlan& plan) {
  const int64_t batch = tokens.size(0);
  TITAN_CHECK_VALUE(batch % plan.microbatch_size == 0,
                    "[titan::pipeline] expected the local batch ({} sequences) divisible by the microbatch size {}, "
                    "got a remainder of {}. Set training.local_batch_size to a multiple of "
                    "parallelism.pipeline_parallel_microbatch_size.",
                    batch, plan.microbatch_size, batch % plan.microbatch_size);
  return batch / plan.microbatch_size;
}

double sum_over_pp(const dist::ProcessGroup& group, double value, const at::Device& device) {
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble).device(device));
  group.all_reduce(t).wait();
  return t.item<double>();
}

}  // namespace

double Pipeline::step(const StageForward& forward, const at::Tensor& tokens, const at::Tensor& labels,
                      const LossFn& loss, double loss_scale, const nn::AttentionContext& context) {
  const PipelineProgram& prog = program(microbatches_of(tokens, state_->plan));
  StepRunner runner(*state_, prog, forward, loss ? loss : LossFn(cross_entropy_sum), loss_scale, /*train=*/true);
  const double local = runner.run(tokens, labels, context);
  if (state_->step_end) state_->step_end();
  return sum_over_pp(state_->group, local, tokens.device());
}

double Pipeline::evaluate(const StageForward& forward, const at::Tensor& tokens, const at::Tensor& labels,
                          const LossFn& loss, const nn::AttentionContext& context) {
  const PipelineProgram prog = detail::forward_only_program(*state_, microbatches_of(tokens, state_->plan));
  StepRunner runner(*state_, prog, forward, loss ? loss : LossFn(cross_entropy_sum), 1.0, /*train=*/false);
  return sum_over_pp(state_->group, runner.run(tokens, labels, context), tokens.device());
}

PipelineTimeline Pipeline::gather_timeline() const {
  // Each rank's row as (op, stage, microbatch, start, end) rows, padded to the longest row.
  const auto& mine = state_->timeline.at(static_cast<size_t>(state_->rank()));
  at::Tensor count =
      at::full({1}, static_cast<int64_t>(mine.size()), at::TensorOptions(at::kLong).device(state_->device));
  state_->group.all_reduce(count, dist::ReduceOp::kMax).wait();
  const int64_t rows = count.item<int64_t>();
  at::Tensor local = at::full({rows, 5}, -1.0, at::kDouble);  // (rows, 5)
  for (size_t i = 0; i < mine.size(); ++i) {
    const TimedAction& t = mine[i];
    const double row[] = {static_cast<double>(t.action.op), static_cast<double>(t.action.stage),
                          static_cast<double>(t.action.microbatch), t.start, t.end};
    for (int64_t c = 0; c < 5; ++c) local[static_cast<int64_t>(i)][c] = row[c];
  }
  at::Tensor all = at::empty({state_->group.size() * rows * 5},
                             at::TensorOptions(at::kDouble).device(state_->device));  // (pp * rows * 5)
  state_->group.all_gather(all, local.reshape({-1}).to(state_->device)).wait();
  const at::Tensor table = all.view({state_->group.size(), rows, 5}).cpu();
  PipelineTimeline timeline(static_cast<size_t>(state_->group.size()));
  for (int64_t r = 0; r < table.size(0); ++r) {
    for (int64_t i = 0; i < rows; ++i) {
      const at::Tensor row = table[r][i];
      if (row[0].item<double>() < 0) continue;
      timeline[static_cast<size_t>(r)].push_back(
          {.action = {.op = static_cast<PipelineAction::Op>(row[0].item<int64_t>()),
                      .stage = row[1].item<int64_t>(),
                      .microbatch = row[2].item<int64_t>()},
           .start = row[3].item<double>(),
           .end = row[4].item<double>()});
    }
  }
  return timeline;
}

}  // namespace titan::parallel
