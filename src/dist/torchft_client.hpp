// SPDX-License-Identifier: BSD-3-Clause
// A client of TorchFT's lighthouse (grpc/torchft.proto) in plain C++ types, so that gRPC's headers stay in the one
// source that makes the calls (grpc/torchft_client.cpp). Built without gRPC (-DTITAN_WITH_GRPC=OFF), the client
// refuses with a message naming the option (no_grpc/torchft_client.cpp).
//
// The messages are encoded here (torchft_wire.cpp), not by protoc's generated code: that code needs libprotobuf,
// and Debian's libsentencepiece0 (titan's tokenizers) bundles a protobuf of another version and exports its symbols,
// so a process holding both crashes as it loads. The .proto stays the contract: a test holds these bytes to what
// protoc encodes and decodes from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan::dist::detail {

/// One replica group in a TorchFT quorum (torchft.QuorumMember).
struct TorchftMember {
  /// Unique per process: a restarted replica is a new member, as TorchFT's manager makes it.
  std::string replica_id{};
  /// host:port of the member's store.
  std::string store_address{};
  /// The member's committed step.
  int64_t step = 0;
  /// Ranks in the member's replica group.
  uint64_t world_size = 0;
  /// > 0: the member's last step did not commit.
  int64_t commit_failures = 0;
};

/// A quorum the lighthouse decided (torchft.Quorum).
struct TorchftQuorum {
  /// Changes whenever the members change or one reports a commit failure.
  int64_t quorum_id = 0;
  /// Sorted by replica_id, as the lighthouse sends them.
  std::vector<TorchftMember> participants{};
};

/// torchft.LighthouseQuorumRequest{requester: me} in protobuf's wire format.
std::string encode_quorum_request(const TorchftMember& me);
/// torchft.LighthouseHeartbeatRequest{replica_id}.
std::string encode_heartbeat_request(const std::string& replica_id);
/// torchft.LighthouseQuorumResponse: its quorum's id and members (fields titan does not read are skipped). Throws
/// std::runtime_error on bytes that are not one.
TorchftQuorum decode_quorum_response(const std::string& bytes);

/// gRPC channel to one `torchft_lighthouse`; calls from several threads are safe.
class TorchftClient {
 public:
  /// target: host:port of the lighthouse.
  explicit TorchftClient(const std::string& target);
  ~TorchftClient();
  TorchftClient(const TorchftClient&) = delete;
  TorchftClient& operator=(const TorchftClient&) = delete;

  /// Joins the next quorum and blocks until the lighthouse decides one that holds `me`. Throws on an RPC
  /// failure; `timed_out` is set (and nothing thrown) when `timeout` passed first.
  TorchftQuorum quorum(const TorchftMember& me, std::chrono::milliseconds timeout, bool& timed_out);
  /// Tells the lighthouse this member is alive; false when the call failed.
  bool heartbeat(const std::string& replica_id, std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::dist::detail
