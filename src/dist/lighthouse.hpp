// SPDX-License-Identifier: BSD-3-Clause
// Private: where a replica's rank 0 meets the other replica groups (dist/replica_group.hpp). Two lighthouses
// implement it:
//   store_lighthouse.cpp    titan's own, rounds over a plain key-value store served by titan-lighthouse
//                           (fault_tolerance.lighthouse = host:port); no dependency beyond c10d.
//   torchft_lighthouse.cpp  TorchFT's `torchft_lighthouse` over gRPC (fault_tolerance.lighthouse =
//                           http://host:port, as TORCHFT_LIGHTHOUSE takes it). It decides quorums only: the
//                           cross-replica rendezvous and the commit vote go through a store one member hosts.
// ReplicaGroup does the rest (sharing the quorum with the replica's ranks, the groups, heal, average) the same
// way over both.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "titan/dist/replica_group.hpp"
#include "titan/dist/store.hpp"

namespace titan::dist::detail {

class Lighthouse {
 public:
  virtual ~Lighthouse() = default;
  /// Joins the next quorum with this replica's committed step (fresh: its last step did not commit, so the
  /// cross-replica groups must be rebuilt) and blocks until a quorum holding this replica is decided. Fills
  /// round, id, replicas, steps and me. Throws when options.quorum_timeout passes first.
  virtual Quorum join(int64_t step, bool fresh) = 0;
  /// host:port of the store q's cross-replica groups meet in: every rank of every member opens it.
  virtual std::string rendezvous(const Quorum& q) const = 0;
  /// q's commit vote: whether every member voted ok. Every member gets the same verdict.
  virtual bool vote(const Quorum& q, bool ok) = 0;
};

/// The lighthouse options.lighthouse names: TorchFT's for http://host:port, titan's store for host:port.
/// world_size: ranks in this replica group.
std::unique_ptr<Lighthouse> open_lighthouse(const ReplicaOptions& options, int64_t world_size);

/// titan's lighthouse: the store at options.lighthouse (host:port).
std::unique_ptr<Lighthouse> store_lighthouse(const ReplicaOptions& options);
/// TorchFT's lighthouse at target (host:port, the http:// of options.lighthouse taken off).
std::unique_ptr<Lighthouse> torchft_lighthouse(const ReplicaOptions& options, const std::string& target,
                                               int64_t world_size);

/// A client of the TCP store at "host:port"; `what` names the address's source in the error for a malformed one.
Store connect_store(const std::string& address, std::chrono::milliseconds timeout, const char* what);

/// The commit vote over `store` (a prefix of its own per vote) among `members`: a failed member adds to fails
/// before it votes; the first to see every vote, a failure or the timeout writes the verdict all read.
bool store_vote(const Store& store, int64_t members, bool ok, std::chrono::milliseconds timeout);

/// Index in q.replicas of the replica that heals the others: the lowest id at the highest step.
int64_t source_of(const Quorum& q);

}  // namespace titan::dist::detail
