// SPDX-License-Identifier: BSD-3-Clause
// The TorchFT lighthouse client of a build without gRPC: it refuses, naming the option that builds it.
#include "../torchft_client.hpp"

#include "titan/core/error.hpp"

namespace titan::dist::detail {

struct TorchftClient::Impl {};

TorchftClient::TorchftClient(const std::string& target) {
  TITAN_CHECK_VALUE(false,
                    "[titan::dist::ReplicaGroup] expected a titan built with gRPC to reach TorchFT's lighthouse at "
                    "'http://{}' (fault_tolerance.lighthouse), got a build without it. Install grpc++ (libgrpc++-dev, "
                    "scripts/setup.sh) and configure with -DTITAN_WITH_GRPC=ON, or run titan-lighthouse and give its "
                    "host:port.",
                    target);
}

TorchftClient::~TorchftClient() = default;

TorchftQuorum TorchftClient::quorum(const TorchftMember&, std::chrono::milliseconds, bool& timed_out) {
  timed_out = false;
  return {};
}

bool TorchftClient::heartbeat(const std::string&, std::chrono::milliseconds) { return false; }

}  // namespace titan::dist::detail
