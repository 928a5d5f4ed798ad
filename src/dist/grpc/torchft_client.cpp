// SPDX-License-Identifier: BSD-3-Clause
// TorchFT's lighthouse over gRPC: the code protoc generates from torchft.proto is built with the library
// (never committed), and only this source includes it.
#include <grpcpp/grpcpp.h>

#include <stdexcept>

#include "../torchft_client.hpp"
#include "torchft.grpc.pb.h"

namespace titan::dist::detail {

struct TorchftClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<torchft::LighthouseService::Stub> stub;
};

TorchftClient::TorchftClient(const std::string& target) : impl_(std::make_unique<Impl>()) {
  impl_->channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  impl_->stub = torchft::LighthouseService::NewStub(impl_->channel);
}

TorchftClient::~TorchftClient() = default;

TorchftQuorum TorchftClient::quorum(const TorchftMember& me, std::chrono::milliseconds timeout, bool& timed_out) {
  torchft::LighthouseQuorumRequest request;
  torchft::QuorumMember* requester = request.mutable_requester();
  requester->set_replica_id(me.replica_id);
  requester->set_store_address(me.store_address);
  requester->set_step(me.step);
  requester->set_world_size(me.world_size);
  requester->set_commit_failures(me.commit_failures);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  // The lighthouse may not be up yet (started beside the job): wait for it within the deadline.
  context.set_wait_for_ready(true);
  torchft::LighthouseQuorumResponse response;
  const grpc::Status status = impl_->stub->Quorum(&context, request, &response);
  timed_out = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (timed_out) return {};
  if (!status.ok()) {
    throw std::runtime_error("Quorum RPC failed with gRPC status " + std::to_string(status.error_code()) + ": " +
                             status.error_message());
  }
  TorchftQuorum out{.quorum_id = response.quorum().quorum_id(), .participants = {}};
  for (const torchft::QuorumMember& m : response.quorum().participants()) {
    out.participants.push_back({.replica_id = m.replica_id(),
                                .store_address = m.store_address(),
                                .step = m.step(),
                                .world_size = m.world_size(),
                                .commit_failures = m.commit_failures()});
  }
  return out;
}

bool TorchftClient::heartbeat(const std::string& replica_id, std::chrono::milliseconds timeout) {
  torchft::LighthouseHeartbeatRequest request;
  request.set_replica_id(replica_id);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  torchft::LighthouseHeartbeatResponse response;
  return impl_->stub->Heartbeat(&context, request, &response).ok();
}

}  // namespace titan::dist::detail
