// SPDX-License-Identifier: BSD-3-Clause
// Private: NCCL's rules over Gloo (the "strict" backend), so that code which Gloo forgives but NCCL would
// hang on fails on CPU, with a message naming the ranks and calls:
//   - point-to-point: between two ranks each side's sends and receives form one queue (NCCL's stream of
//     the pair) that runs in posting order; tags are ignored, the k-th send from a to b meets b's k-th
//     receive from a (their sizes must agree), and a send completes only once that receive is at the head
//     of b's queue too (rendezvous). A batch (ProcessGroup::batch_isend_irecv) enters each of its peers'
//     queues as one unit whose operations progress together: how a pair exchanges in both directions.
//   - collectives: every rank issues the same ones in the same order (checked at wait(), before the data
//     moves: a collective cannot complete before every rank has issued it anyway), and in an all-to-all with
//     splits each rank sends every other as many rows as that one receives from it.
//   - tensors live on the group's device (NCCL takes device tensors only).
// A queue that waits past the group's timeout fails with what both ranks were waiting for. Over a TCP store each
// call waits at most a deadline (as Gloo's collectives do, a host cut off from the store's fails within the timeout
// rather than in recv for the store's own).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deadline_store.hpp"

namespace titan::dist::detail {

/// One send (to peer) or receive (from peer) of a group rank.
struct StrictOp {
  bool send = true;
  at::Tensor tensor;  ///< contiguous; the data sent, or where it lands
  int64_t peer = 0;   ///< group rank
  int64_t tag = 0;    ///< the caller's tag: ignored for matching (NCCL has none), shown in messages
};

class StrictChannel;

/// A collective as the order check sees it.
struct StrictCollective {
  std::string signature;             ///< "all_reduce 1024 x Float sum": what every rank's must equal
  std::vector<int64_t> rows_to{};    ///< an all-to-all with splits: the rows this rank sends each group rank
  std::vector<int64_t> rows_from{};  ///< and those it receives from each; empty for any other collective
};

class StrictRules {
 public:
  StrictRules(std::string group, int64_t rank, std::vector<int64_t> global_ranks, c10::intrusive_ptr<c10d::Store> store,
              c10::intrusive_ptr<c10d::Backend> gloo, std::chrono::milliseconds timeout, at::Device device);
  ~StrictRules();
  StrictRules(const StrictRules&) = delete;
  StrictRules& operator=(const StrictRules&) = delete;

  /// Throws unless t is on the group's device.
  void check_device(const at::Tensor& t, const char* what) const;
  /// Publishes this rank's next collective; returns its sequence number for verify_collective.
  int64_t publish_collective(const StrictCollective& collective);
  /// Throws unless the other rank (rank 0, or rank 1 for rank 0) issued the same collective as its seq-th, and for
  /// an all-to-all with splits unless every other rank issued it too, receiving from this one what it sends there
  /// and sending what it receives.
  void verify_collective(int64_t seq, const StrictCollective& collective) const;
  /// Queues ops (one unit per peer) on their pairs' queues; the Work completes once every op moved.
  c10::intrusive_ptr<c10d::Work> post(std::vector<StrictOp> ops);

  const at::Device& device() const { return device_; }

  // Used by the pair queues.
  const std::string& group() const { return group_; }
  int64_t rank() const { return rank_; }
  int64_t global_rank(int64_t group_rank) const { return global_ranks_[static_cast<size_t>(group_rank)]; }
  /// "rank 1 (global 3)"
  std::string who(int64_t group_rank) const;
  // The rule keeping's store calls (bounded over a network).
  void store_set(const std::string& key, const std::string& value) const;
  std::string store_get(const std::string& key) const;
  bool store_check(const std::string& key) const;
  void store_delete(const std::string& key) const;
  const c10::intrusive_ptr<c10d::Backend>& gloo() const { return gloo_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Polls the store until key exists (or the timeout): "" when it never came.
  std::string wait_key(const std::string& key) const;
  /// Called by the queues while the group lives; false once it is being destroyed.
  bool alive() const;

 private:
  /// Throws unless `other` issued the same signature as this rank's seq-th collective.
  void verify_same(int64_t seq, const std::string& signature, int64_t other) const;
  /// Throws unless `other`'s rows in the all-to-all mirror this rank's.
  void verify_rows(int64_t seq, const StrictCollective& mine, int64_t other) const;

  std::string group_;
  int64_t rank_;
  std::vector<int64_t> global_ranks_;
  c10::intrusive_ptr<c10d::Store> store_;
  DeadlineStore bounded_;  // store_ with a deadline when it is a TCP store, else empty
  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::chrono::milliseconds timeout_;
  at::Device device_;
  int64_t collectives_ = 0;
  std::mutex mutex_;                                            // guards channels_ and collectives_
  std::map<int64_t, std::unique_ptr<StrictChannel>> channels_;  // peer -> this rank's queue toward it
  std::atomic<bool> alive_{true};
};

/// "all_reduce float (1024) sum": what the collective-order check compares.
std::string collective_signature(const char* op, const at::Tensor& t, const std::string& detail = "");

}  // namespace titan::dist::detail
