// SPDX-License-Identifier: BSD-3-Clause
// titan's collective interface: the few operations the parallelisms need, over a c10d backend
// (Gloo on CPU, NCCL on CUDA). It hides Gloo's gaps: AVG is pre-divide + SUM, reduce-scatter works
// on every backend, a group of one rank does no communication at all. It also counts the bytes each
// rank puts on the wire, so benchmarks can compare the measured volume with the theory.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace titan::dist {

class Store;

namespace detail {
struct WorkImpl;
struct GroupImpl;
}  // namespace detail

enum class ReduceOp { kSum, kAvg, kMax, kMin };

/// A pending collective. wait() blocks until its result is in the output tensor (on CUDA: until the
/// current stream is ordered after it) and rethrows a backend error naming the group.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<detail::WorkImpl> impl) : impl_(std::move(impl)) {}
  void wait();
  bool pending() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<detail::WorkImpl> impl_;
};

/// Bytes this rank sent per collective kind (ring algorithm volumes: what NCCL moves; Gloo's
/// emulated reduce-scatter really moves twice the reduce-scatter figure, counted as such).
struct CommStats {
  int64_t all_gather_bytes = 0;      ///< (n-1)/n x output bytes per all-gather
  int64_t reduce_scatter_bytes = 0;  ///< (n-1)/n x input bytes per reduce-scatter
  int64_t all_reduce_bytes = 0;      ///< 2(n-1)/n x bytes per all-reduce
  int64_t other_bytes = 0;           ///< broadcast, all-to-all, point-to-point
  int64_t calls = 0;                 ///< collectives issued
  double wait_seconds = 0;           ///< time blocked in Work::wait: communication not hidden (host side)
  int64_t total() const { return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes + other_bytes; }
};

/// Options for creating a group.
struct GroupOptions {
  /// Rendezvous (backend construction) timeout.
  std::chrono::milliseconds init_timeout{std::chrono::seconds(300)};
  /// Timeout of each collective.
  std::chrono::milliseconds timeout{std::chrono::seconds(100)};
  /// "gloo", "nccl", or "strict": Gloo that enforces NCCL's rules, for tests on CPU (point-to-point matched
  /// in posting order with tags ignored and a send waiting for its receive, collectives in the same order on
  /// every rank, tensors on the group's device); a break is an error naming the ranks and calls.
  std::string backend = "gloo";
  /// Where the group's tensors live: unset, the backend's (the CPU for Gloo, the bound GPU for NCCL). A strict
  /// group refuses tensors elsewhere, so a device set here checks that code asks the group for it.
  std::optional<c10::Device> device{};
  /// The caller handles this group's failures (fault tolerance's cross-replica groups): the flight recorder
  /// neither records nor watches its collectives, and a failed one does not stop the run.
  bool may_fail = false;
  /// Build a real backend even for a group of one (single-GPU NCCL smoke tests); normally a group
  /// of one does no communication at all.
  bool backend_for_single_rank = false;
};

/// One send or receive of a batch (ProcessGroup::batch_isend_irecv).
struct P2POp {
  /// Send tensor to peer, or receive into it from peer.
  bool send = true;
  /// Contiguous; alive and, for a send, unchanged until the batch's wait().
  at::Tensor tensor{};
  /// Group rank of the other side.
  int64_t peer = 0;
  /// Gloo matches a send with the receive of the same tag; NCCL ignores tags and matches in posting order.
  int64_t tag = 0;
};

/// One communicator over a subset of the world's ranks. Copies share the communicator.
class ProcessGroup {
 public:
  /// A group of one rank: every collective is a local copy (no backend, no threads).
  static ProcessGroup single(std::string name);
  /// A group of `size` ranks with no backend: it knows its members and this rank's place among them, and
  /// refuses every collective and point-to-point call with an error naming the group (size 1: single()).
  /// What a planning mesh (Mesh::virtual_mesh) is made of.
  static ProcessGroup unconnected(std::string name, int64_t rank, int64_t size, std::vector<int64_t> global_ranks);
  /// Joins the group `name` as group rank `rank` of `size` over store (blocks until all joined).
  static ProcessGroup create(std::string name, const Store& store, int64_t rank, int64_t size,
                             std::vector<int64_t> global_ranks, const GroupOptions& options);

  int64_t rank() const;
  int64_t size() const;
  const std::string& name() const;
  /// The world ranks of the members, in group-rank order.
  const std::vector<int64_t>& global_ranks() const;
  /// Where its tensors must live (GroupOptions::device): make communication buffers here.
  c10::Device device() const;

  /// In-place all-reduce of a contiguous tensor.
  Work all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum) const;
  /// out (size * in.numel(), contiguous) = concatenation of every rank's in, in group-rank order.
  Work all_gather(at::Tensor& out, const at::Tensor& in) const;
  /// out (in.numel() / size) = this rank's chunk of the element-wise reduction of every rank's in.
  Work reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op = ReduceOp::kSum) const;
  /// out = chunk r of every rank's in, concatenated; in and out split evenly on dim 0.
  Work all_to_all(at::Tensor& out, const at::Tensor& in) const;
  /// Variable splits on dim 0: rank r gets in's rows [sum(in_splits[:r]), +in_splits[r]); out holds
  /// out_splits[r] rows from rank r, in rank order (every rank's in_splits[me] = my out_splits[it]).
  Work all_to_all(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits) const;
  Work broadcast(at::Tensor& tensor, int64_t root) const;
  /// Sends a contiguous tensor to group rank dst; matched with dst's recv of the same tag (its
  /// shape and dtype must agree). The tensor must stay alive and unchanged until wait().
  Work send(const at::Tensor& tensor, int64_t dst, int64_t tag) const;
  /// Receives into a contiguous tensor from group rank src (the send with the same tag).
  Work recv(at::Tensor& tensor, int64_t src, int64_t tag) const;
  /// Posts sends and receives as one group (NCCL's group start/end, PyTorch's batch_isend_irecv): none waits
  /// for another to be matched, so two ranks may each send to and receive from the other without either
  /// posting order hanging under NCCL. One Work for all of them; an empty batch does nothing.
  Work batch_isend_irecv(const std::vector<P2POp>& ops) const;
  void barrier() const;

  /// Bytes sent so far by this rank through this group.
  CommStats stats() const;
  void reset_stats() const;

 private:
  explicit ProcessGroup(std::shared_ptr<detail::GroupImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::GroupImpl> impl_;
};

}  // namespace titan::dist
