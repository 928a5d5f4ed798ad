// SPDX-License-Identifier: BSD-3-Clause
#include "titan/dist/process_group.hpp"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>

#include "flight_recorder_impl.hpp"
#include "interface.hpp"
#include "store_impl.hpp"
#include "strict_backend.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/store.hpp"

namespace titan::dist {
namespace detail {

struct GroupImpl;

struct WorkImpl {
  c10::intrusive_ptr<c10d::Work> work;
  std::shared_ptr<GroupImpl> group;
  int64_t trace_id = -1;   // flight-recorder entry, -1 when the recorder is off
  int64_t strict_seq = 0;  // strict groups: the collective's number, checked against the other ranks' at wait()
  StrictCollective strict_collective{};
};

struct GroupImpl {
  std::string name;
  int64_t rank = 0;
  int64_t size = 1;
  std::vector<int64_t> global_ranks;
  c10::intrusive_ptr<c10d::Backend> backend;  // null for a group of one, or an unconnected one
  bool unconnected = false;                   // several ranks, no backend (a planning mesh): no calls
  std::atomic<int64_t> all_gather_bytes{0}, reduce_scatter_bytes{0}, all_reduce_bytes{0}, other_bytes{0}, calls{0};
  std::atomic<int64_t> wait_ns{0};
  std::atomic<int64_t> seq{0};  // collectives issued (flight recorder's per-group sequence number)
  bool may_fail = false;        // GroupOptions::may_fail: not traced
  c10::Device device = at::kCPU;
  std::shared_ptr<StrictRules> strict;  // the "strict" backend's rule keeper, else null
};

}  // namespace detail

namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;  // kAvg is pre-divided: Gloo has no AVG
  }
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAvg:
      return "avg";
    default:
      return "sum";
  }
}

void check_contiguous(const at::Tensor& t, const char* what, const std::string& group) {
  TITAN_CHECK_VALUE(t.is_contiguous(),
                    "[titan::dist::ProcessGroup] expected a contiguous {} tensor for group '{}', got "
                    "strides {}. Call .contiguous() first.",
                    what, group, c10::str(t.strides()));
}

// Point-to-point needs another member: a group of one has nobody to talk to.
void check_peer(int64_t peer, const char* what, int64_t rank, int64_t size, const std::string& group) {
  TITAN_CHECK_VALUE(peer >= 0 && peer < size && peer != rank,
                    "[titan::dist::ProcessGroup] expected to {} another rank of group '{}' (size {}), got rank {} "
                    "from rank {}. Check the stage placement.",
                    what, group, size, peer, rank);
}

// Whether a call has no backend to go through: a group of one copies locally; an unconnected group of several
// (a planning mesh's) refuses it.
bool without_backend(const detail::GroupImpl& g, const char* op) {
  if (g.backend) return false;
  TITAN_CHECK_VALUE(!g.unconnected,
                    "[titan::dist::ProcessGroup] expected no {} on group '{}' of {} ranks, got one: it belongs to a "
                    "planning mesh (dist::Mesh::virtual_mesh), which has sizes and ranks but no process group. Plan "
                    "on the meta device over it; communicate over a Mesh built from a store (Mesh::from_launch_env).",
                    op, g.name, g.size);
  return true;
}

// A strict group checks its tensors' device, and a collective's place in every rank's order (signature
// non-empty; point-to-point has its own rules) and an all-to-all's splits against the other ranks'.
struct StrictCheck {
  std::initializer_list<const at::Tensor*> tensors;
  std::string signature{};
  std::vector<int64_t> rows_to{}, rows_from{};  // all-to-all with splits: in_splits, out_splits
};

// A collective that failed on this rank: the flight recorder marks it (and dumps every rank's ring), and the error
// names the group and the cause.
[[noreturn]] void collective_failed(const std::string& group, int64_t trace_id, const std::exception& e) {
  const std::string recorded = detail::mark_failed(trace_id, error_message(e));
  TITAN_CHECK(false,
              "[titan::dist] expected the collective on group '{}' to complete, got: {}. Another rank may have "
              "failed or timed out (comm.train_timeout_seconds); its log names the first error.{}",
              group, error_message(e), recorded);
}

// Issues a collective through call(), recorded by the flight recorder when it is on.
template <class Call>
Work issue(const std::shared_ptr<detail::GroupImpl>& g, const char* op, const at::Tensor& input, Call&& call,
           const StrictCheck& strict = {}) {
  if (g->strict) {
    for (const at::Tensor* t : strict.tensors) g->strict->check_device(*t, op);
  }
  int64_t id = -1;
  if (detail::recorder_enabled() && !g->may_fail) {
    const detail::TracedGroup traced{.name = g->name, .ranks = g->global_ranks};
    detail::before_collective(traced, op);
    id = detail::record_collective(traced, ++g->seq, op, input);
  }
  // A strict group's rules talk to the store: inside the recorded collective, so that a store out of reach fails it
  // as the backend's own timeout would, with the flight recorder's dump.
  int64_t strict_seq = 0;
  detail::StrictCollective collective;
  if (g->strict && !strict.signature.empty()) {
    collective = {.signature = strict.signature, .rows_to = strict.rows_to, .rows_from = strict.rows_from};
    try {
      strict_seq = g->strict->publish_collective(collective);
      // Rows that disagree abort the process inside Gloo's transport (an enforce on its I/O thread), so an
      // all-to-all with splits is checked before its data moves rather than at wait().
      if (!collective.rows_to.empty()) {
        g->strict->verify_collective(strict_seq, collective);
        strict_seq = 0;
      }
    } catch (const std::exception& e) {
      collective_failed(g->name, id, e);
    }
  }
  c10::intrusive_ptr<c10d::Work> work = call();
  if (id >= 0) detail::watch(id, work);
  return Work(std::make_shared<detail::WorkImpl>(detail::WorkImpl{.work = std::move(work),
                                                                  .group = g,
                                                                  .trace_id = id,
                                                                  .strict_seq = strict_seq,
                                                                  .strict_collective = std::move(collective)}));
}

// Several backend works as one (a Gloo batch of sends and receives).
class WorkList : public c10d::Work {
 public:
  explicit WorkList(std::vector<c10::intrusive_ptr<c10d::Work>> works) : works_(std::move(works)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  bool isCompleted() override {
    for (auto& w : works_)
      if (!w->isCompleted()) return false;
    return true;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

}  // namespace

void Work::wait() {
  if (!impl_) return;
  const auto start = std::chrono::steady_clock::now();
  detail::mark_started(impl_->trace_id);
  try {
    if (impl_->strict_seq > 0) impl_->group->strict->verify_collective(impl_->strict_seq, impl_->strict_collective);
    impl_->work->wait();
    // NCCL's wait() only orders the current stream after the kernel: the watchdog sees it complete. On
    // Gloo wait() returns once it completed (its reduce-scatter's isCompleted() stays false for good).
    if (impl_->trace_id >= 0 && (impl_->work->isCompleted() || impl_->group->backend->getBackendName() != "nccl")) {
      detail::mark_completed(impl_->trace_id);
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    impl_->group->wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count();
  } catch (const std::exception& e) {
    const std::string group = impl_->group->name;
    const int64_t trace_id = impl_->trace_id;
    impl_.reset();
    collective_failed(group, trace_id, e);
  }
  impl_.reset();
}

ProcessGroup ProcessGroup::single(std::string name) {
  auto impl = std::make_shared<detail::GroupImpl>();
  impl->name = std::move(name);
  impl->global_ranks = {0};
  return ProcessGroup(std::move(impl));
}

ProcessGroup ProcessGroup::unconnected(std::string name, int64_t rank, int64_t size,
                                       std::vector<int64_t> global_ranks) {
  TITAN_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size && static_cast<int64_t>(global_ranks.size()) == size,
                    "[titan::dist::ProcessGroup] expected 0 <= rank < size and size members for group '{}', got rank "
                    "{} of {} with {} members.",
                    name, rank, size, global_ranks.size());
  ProcessGroup g = single(std::move(name));
  g.impl_->rank = rank;
  g.impl_->size = size;
  g.impl_->global_ranks = std::move(global_ranks);
  g.impl_->unconnected = size > 1;
  return g;
}

ProcessGroup ProcessGroup::create(std::string name, const Store& store, int64_t rank, int64_t size,
                                  std::vector<int64_t> global_ranks, const GroupOptions& options) {
  TITAN_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size,
                    "[titan::dist::ProcessGroup] expected 0 <= rank < size for group '{}', got rank {} of {}.", name,
                    rank, size);
  if (size == 1 && !options.backend_for_single_rank) {
    ProcessGroup g = single(std::move(name));
    g.impl_->global_ranks = std::move(global_ranks);
    if (options.device) g.impl_->device = *options.device;
    return g;
  }
  auto impl = std::make_shared<detail::GroupImpl>();
  impl->name = name;
  impl->rank = rank;
  impl->size = size;
  impl->global_ranks = std::move(global_ranks);
  impl->may_fail = options.may_fail;
  const Store group_store = store.prefixed("titan/group/" + name);
  try {
    if (options.backend == "nccl") {
      impl->backend = detail::make_nccl_backend(group_store.impl()->store, rank, size, options.timeout);
      impl->device = impl->backend->getBoundDeviceId().value_or(at::Device(at::kCUDA));
    } else {
      TITAN_CHECK_VALUE(options.backend == "gloo" || options.backend == "strict",
                        "[titan::dist::ProcessGroup] expected backend gloo, nccl or strict, got '{}'.",
                        options.backend);
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.init_timeout);
      // GLOO_SOCKET_IFNAME's interfaces, else the address that reaches the store's host (loopback on one host).
      gloo_options->devices = detail::gloo_devices(group_store.impl()->store);
      gloo_options->threads = 2;  // one collective in flight per direction is all FSDP overlaps
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(group_store.impl()->store, static_cast<int>(rank),
                                                                  static_cast<int>(size), gloo_options);
      impl->backend->setTimeout(options.timeout);
      if (options.backend == "strict") {
        impl->strict = std::make_shared<detail::StrictRules>(
            name, rank, impl->global_ranks, group_store.prefixed("strict").impl()->store, impl->backend,
            options.timeout, options.device.value_or(at::Device(at::kCPU)));
      }
    }
    if (options.device) impl->device = *options.device;
  } catch (const c10::ValueError&) {
    throw;
  } catch (const std::exception& e) {
    TITAN_CHECK(false,
                "[titan::dist::ProcessGroup] expected all {} ranks of group '{}' to join within {} s "
                "(comm.init_timeout_seconds), got: {}. Check that every rank runs the same parallelism config.",
                size, name, options.init_timeout.count() / 1000, error_message(e));
  }
  return ProcessGroup(std::move(impl));
}

int64_t ProcessGroup::rank() const { return impl_->rank; }
int64_t ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::name() const { return impl_->name; }
const std::vector<int64_t>& ProcessGroup::global_ranks() const { return impl_->global_ranks; }
c10::Device ProcessGroup::device() const { return impl_->device; }

Work ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) const {
  if (without_backend(*impl_, "all_reduce")) return {};
  check_contiguous(tensor, "all_reduce", impl_->name);
  if (op == ReduceOp::kAvg) tensor.div_(static_cast<double>(impl_->size));
  impl_->all_reduce_bytes += 2 * (impl_->size - 1) * nbytes(tensor) / impl_->size;
  ++impl_->calls;
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  return issue(impl_, "all_reduce", tensor, [&] { return impl_->backend->allreduce(tensors, options); },
               {.tensors = {&tensor}, .signature = detail::collective_signature("all_reduce", tensor, op_name(op))});
}

Work ProcessGroup::all_gather(at::Tensor& out, const at::Tensor& in) const {
  TITAN_CHECK_VALUE(
      out.numel() == in.numel() * impl_->size,
      "[titan::dist::ProcessGroup] expected an all-gather output of {} x {} elements on group '{}', got {}.",
      impl_->size, in.numel(), impl_->name, out.numel());
  if (without_backend(*impl_, "all_gather")) {
    out.view_as(in).copy_(in);
    return {};
  }
  check_contiguous(out, "all_gather output", impl_->name);
  check_contiguous(in, "all_gather input", impl_->name);
  impl_->all_gather_bytes += (impl_->size - 1) * nbytes(in);
  ++impl_->calls;
  at::Tensor flat_out = out.view({-1});
  at::Tensor flat_in = in.view({-1});
  return issue(impl_, "all_gather", in, [&] { return impl_->backend->_allgather_base(flat_out, flat_in); },
               {.tensors = {&out, &in}, .signature = detail::collective_signature("all_gather", in)});
}

Work ProcessGroup::reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) const {
  TITAN_CHECK_VALUE(
      in.numel() == out.numel() * impl_->size,
      "[titan::dist::ProcessGroup] expected a reduce-scatter input of {} x {} elements on group '{}', got {}.",
      impl_->size, out.numel(), impl_->name, in.numel());
  TITAN_CHECK_VALUE(op == ReduceOp::kSum || op == ReduceOp::kAvg,
                    "[titan::dist::ProcessGroup] expected SUM or AVG for reduce-scatter on group '{}'.", impl_->name);
  if (without_backend(*impl_, "reduce_scatter")) {
    out.copy_(in.view_as(out));
    return {};
  }
  check_contiguous(out, "reduce_scatter output", impl_->name);
  at::Tensor flat_in = in.contiguous().view({-1});
  if (op == ReduceOp::kAvg) flat_in = flat_in / static_cast<double>(impl_->size);
  const bool emulated = impl_->backend->getBackendName() == "gloo";  // Gloo: all-reduce + take a chunk
  impl_->reduce_scatter_bytes += (emulated ? 2 : 1) * (impl_->size - 1) * nbytes(out);
  ++impl_->calls;
  at::Tensor flat_out = out.view({-1});
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  return issue(impl_, "reduce_scatter", in,
               [&] { return impl_->backend->_reduce_scatter_base(flat_out, flat_in, options); },
               {.tensors = {&out, &in}, .signature = detail::collective_signature("reduce_scatter", out)});
}

Work ProcessGroup::all_to_all(at::Tensor& out, const at::Tensor& in) const {
  TITAN_CHECK_VALUE(out.numel() == in.numel(),
                    "[titan::dist::ProcessGroup] expected all-to-all tensors of equal size on "
                    "group '{}', got {} and {}.",
                    impl_->name, in.numel(), out.numel());
  if (without_backend(*impl_, "all_to_all")) {
    out.copy_(in);
    return {};
  }
  check_contiguous(out, "all_to_all output", impl_->name);
  at::Tensor contiguous_in = in.contiguous();
  impl_->other_bytes += (impl_->size - 1) * nbytes(in) / impl_->size;
  ++impl_->calls;
  std::vector<int64_t> even_split;
  return issue(impl_, "all_to_all", in,
               [&] { return impl_->backend->alltoall_base(out, contiguous_in, even_split, even_split); },
               {.tensors = {&out, &in}, .signature = detail::collective_signature("all_to_all", in)});
}

Work ProcessGroup::all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                              const std::vector<int64_t>& in_splits) const {
  const auto n = static_cast<size_t>(impl_->size);
  TITAN_CHECK_VALUE(out_splits.size() == n && in_splits.size() == n,
                    "[titan::dist::ProcessGroup] expected {} all-to-all splits on group '{}', got {} and {}.", n,
                    impl_->name, out_splits.size(), in_splits.size());
  int64_t in_rows = 0, out_rows = 0;
  for (size_t r = 0; r < n; ++r) {
    in_rows += in_splits[r];
    out_rows += out_splits[r];
  }
  TITAN_CHECK_VALUE(in.dim() >= 1 && out.dim() >= 1 && in.size(0) == in_rows && out.size(0) == out_rows,
                    "[titan::dist::ProcessGroup] expected all-to-all rows {} in and {} out (the splits' sums) on "
                    "group '{}', got {} and {}. Exchange the counts first.",
                    in_rows, out_rows, impl_->name, in.dim() >= 1 ? in.size(0) : 0, out.dim() >= 1 ? out.size(0) : 0);
  if (without_backend(*impl_, "all_to_all")) {
    out.copy_(in);
    return {};
  }
  check_contiguous(out, "all_to_all output", impl_->name);
  at::Tensor contiguous_in = in.contiguous();
  const int64_t row_bytes = in_rows > 0 ? nbytes(in) / in_rows : 0;
  impl_->other_bytes += (in_rows - in_splits[static_cast<size_t>(impl_->rank)]) * row_bytes;
  ++impl_->calls;
  std::vector<int64_t> out_s = out_splits, in_s = in_splits;
  // Ranks send different row counts: what they must agree on is the row's width and dtype.
  const int64_t row = c10::multiply_integers(in.sizes().slice(1));  // known even when this rank sends no row
  return issue(impl_, "all_to_all", in, [&] { return impl_->backend->alltoall_base(out, contiguous_in, out_s, in_s); },
               {.tensors = {&out, &in},
                .signature = fmt::format("all_to_all_v rows of {} x {}", row, c10::toString(in.scalar_type())),
                .rows_to = in_splits,
                .rows_from = out_splits});
}

Work ProcessGroup::broadcast(at::Tensor& tensor, int64_t root) const {
  if (without_backend(*impl_, "broadcast")) return {};
  check_contiguous(tensor, "broadcast", impl_->name);
  impl_->other_bytes += impl_->rank == root ? nbytes(tensor) : 0;
  ++impl_->calls;
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return issue(impl_, "broadcast", tensor, [&] { return impl_->backend->broadcast(tensors, options); },
               {.tensors = {&tensor},
                .signature = detail::collective_signature("broadcast", tensor, fmt::format("root {}", root))});
}

Work ProcessGroup::send(const at::Tensor& tensor, int64_t dst, int64_t tag) const {
  return batch_isend_irecv({P2POp{.send = true, .tensor = tensor, .peer = dst, .tag = tag}});
}

Work ProcessGroup::recv(at::Tensor& tensor, int64_t src, int64_t tag) const {
  return batch_isend_irecv({P2POp{.send = false, .tensor = tensor, .peer = src, .tag = tag}});
}

Work ProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops) const {
  if (ops.empty()) return {};
  if (impl_->unconnected) without_backend(*impl_, ops[0].send ? "send" : "recv");
  // NCCL moves a rank's message to itself inside a group (the one-GPU device check exercises p2p so);
  // anywhere else a peer is another rank.
  const bool to_self_ok = impl_->backend && impl_->backend->getBackendName() == "nccl" && ops.size() > 1;
  for (const P2POp& op : ops) {
    if (!(to_self_ok && op.peer == impl_->rank))
      check_peer(op.peer, op.send ? "send to" : "receive from", impl_->rank, impl_->size, impl_->name);
    check_contiguous(op.tensor, op.send ? "send" : "recv", impl_->name);
    if (op.send) impl_->other_bytes += nbytes(op.tensor);
  }
  ++impl_->calls;
  const char* name = ops.size() > 1 ? "batch_isend_irecv" : ops[0].send ? "send" : "recv";
  c10d::Backend& backend = *impl_->backend;
  auto post = [&](const P2POp& op) {
    std::vector<at::Tensor> tensors{op.tensor};
    return op.send ? backend.send(tensors, static_cast<int>(op.peer), static_cast<int>(op.tag))
                   : backend.recv(tensors, static_cast<int>(op.peer), static_cast<int>(op.tag));
  };
  return issue(impl_, name, ops[0].tensor, [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (impl_->strict) {
      std::vector<detail::StrictOp> strict_ops;
      for (const P2POp& op : ops)
        strict_ops.push_back({.send = op.send, .tensor = op.tensor, .peer = op.peer, .tag = op.tag});
      return impl_->strict->post(std::move(strict_ops));
    }
    if (ops.size() == 1) return post(ops[0]);
    if (backend.supportsCoalescing()) {  // NCCL: one group start/end around them
      backend.startCoalescing();
      for (const P2POp& op : ops) post(op);
      return backend.endCoalescing();
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> works;  // Gloo: tagged and asynchronous, no grouping needed
    for (const P2POp& op : ops) works.push_back(post(op));
    return c10::make_intrusive<WorkList>(std::move(works));
  });
}

void ProcessGroup::barrier() const {
  if (without_backend(*impl_, "barrier")) return;
  issue(impl_, "barrier", at::Tensor(), [&] { return impl_->backend->barrier(); },
        {.tensors = {}, .signature = "barrier"})
      .wait();
}

CommStats ProcessGroup::stats() const {
  return {.all_gather_bytes = impl_->all_gather_bytes,
          .reduce_scatter_bytes = impl_->reduce_scatter_bytes,
          .all_reduce_bytes = impl_->all_reduce_bytes,
          .other_bytes = impl_->other_bytes,
          .calls = impl_->calls,
          .wait_seconds = static_cast<double>(impl_->wait_ns) * 1e-9};
}

void ProcessGroup::reset_stats() const {
  impl_->all_gather_bytes = impl_->reduce_scatter_bytes = impl_->all_reduce_bytes = impl_->other_bytes = impl_->calls =
      0;
  impl_->wait_ns = 0;
}

}  // namespace titan::dist
