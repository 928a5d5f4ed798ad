// SPDX-License-Identifier: BSD-3-Clause
// TorchFT's lighthouse over gRPC: unary calls of torchft.LighthouseService through gRPC's generic stub, with the
// messages encoded by torchft_wire.cpp (torchft_client.hpp says why not protoc's code). Compiled apart from
// LibTorch, whose include folder ships protobuf headers that gRPC's must not meet.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <future>
#include <stdexcept>

#include "../torchft_client.hpp"

namespace titan::dist::detail {
namespace {

grpc::ByteBuffer to_buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string from_buffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) throw std::runtime_error("an unreadable response");
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

struct TorchftClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;

  // One unary call of the lighthouse's `method`, waited for.
  grpc::Status call(const char* method, const std::string& request, std::string& response,
                    std::chrono::milliseconds timeout, bool wait_for_ready) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    context.set_wait_for_ready(wait_for_ready);
    const grpc::ByteBuffer sent = to_buffer(request);
    grpc::ByteBuffer received;
    std::promise<grpc::Status> done;
    stub->UnaryCall(&context, method, grpc::StubOptions(), &sent, &received,
                    [&](grpc::Status status) { done.set_value(std::move(status)); });
    grpc::Status status = done.get_future().get();
    if (status.ok()) response = from_buffer(received);
    return status;
  }
};

TorchftClient::TorchftClient(const std::string& target) : impl_(std::make_unique<Impl>()) {
  impl_->channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  impl_->stub = std::make_unique<grpc::GenericStub>(impl_->channel);
}

TorchftClient::~TorchftClient() = default;

TorchftQuorum TorchftClient::quorum(const TorchftMember& me, std::chrono::milliseconds timeout, bool& timed_out) {
  std::string response;
  // The lighthouse may not be up yet (started beside the job): wait for it within the deadline.
  const grpc::Status status = impl_->call("/torchft.LighthouseService/Quorum", encode_quorum_request(me), response,
                                          timeout, /*wait_for_ready=*/true);
  timed_out = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (timed_out) return {};
  if (!status.ok()) {
    throw std::runtime_error("the Quorum call failed with gRPC status " + std::to_string(status.error_code()) + ": " +
                             status.error_message());
  }
  return decode_quorum_response(response);
}

bool TorchftClient::heartbeat(const std::string& replica_id, std::chrono::milliseconds timeout) {
  std::string response;
  return impl_
      ->call("/torchft.LighthouseService/Heartbeat", encode_heartbeat_request(replica_id), response, timeout,
             /*wait_for_ready=*/false)
      .ok();
}

}  // namespace titan::dist::detail
