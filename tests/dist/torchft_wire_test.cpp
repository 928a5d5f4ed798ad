// SPDX-License-Identifier: BSD-3-Clause
// TorchFT's lighthouse messages as titan encodes and decodes them (src/dist/torchft_wire.cpp), held to protoc's
// encoding of the same messages from titan's .proto (src/dist/grpc/torchft.proto, TorchFT's field numbers): the bytes
// titan sends are protoc's, and what protoc encodes (with fields titan never reads) titan reads back.
#include <catch2/catch.hpp>

#include "../../src/dist/torchft_client.hpp"
#include "dist/subprocess.hpp"

namespace torchft_wire_test {

namespace fs = std::filesystem;
using titan::dist::detail::TorchftMember;

// `text` (protobuf text format) encoded by protoc as message `type` of torchft.proto.
std::string protoc_encode(const std::string& type, const std::string& text) {
  titan::test::TempDir dir;
  titan::test::write_file(dir.path / "in.txt", text);
  const fs::path proto_dir = titan::test::source_dir() / "src" / "dist" / "grpc";
  titan::test::Subprocess protoc({"/bin/sh", "-c",
                                  "protoc --encode=torchft." + type + " -I '" + proto_dir.string() +
                                      "' torchft.proto < '" + (dir.path / "in.txt").string() + "' > '" +
                                      (dir.path / "out.bin").string() + "'"});
  const std::optional<int> status = protoc.wait(60);
  INFO(protoc.output());
  REQUIRE(status == 0);
  return titan::test::read_file(dir.path / "out.bin");
}

}  // namespace torchft_wire_test

using torchft_wire_test::protoc_encode;
using torchft_wire_test::TorchftMember;

TEST_CASE("TorchFT lighthouse wire: titan's quorum and heartbeat requests are the bytes protoc encodes from the .proto",
          "[dist][fault_tolerance][torchft]") {
  const TorchftMember me{
      .replica_id = "1:00c0ffee", .store_address = "node7:40123", .step = 300, .world_size = 8, .commit_failures = 2};
  CHECK(titan::dist::detail::encode_quorum_request(me) ==
        protoc_encode("LighthouseQuorumRequest",
                      "requester { replica_id: \"1:00c0ffee\" store_address: "
                      "\"node7:40123\" step: 300 world_size: 8 commit_failures: 2 }"));
  // Defaults are left out, as proto3 does; the requester itself stays.
  CHECK(titan::dist::detail::encode_quorum_request({.replica_id = "0:1", .store_address = "h:1"}) ==
        protoc_encode("LighthouseQuorumRequest", "requester { replica_id: \"0:1\" store_address: \"h:1\" }"));
  CHECK(titan::dist::detail::encode_heartbeat_request("0:abc") ==
        protoc_encode("LighthouseHeartbeatRequest", "replica_id: \"0:abc\""));
}

TEST_CASE("TorchFT lighthouse wire: a quorum response protoc encodes is read back, unknown fields skipped",
          "[dist][fault_tolerance][torchft]") {
  // Every field of the messages, a negative step (ten-byte varint) and the creation time titan does not read.
  const std::string bytes = protoc_encode(
      "LighthouseQuorumResponse",
      "quorum { quorum_id: 17 "
      "participants { replica_id: \"0:aa\" address: \"http://m0:1\" store_address: \"m0:2\" step: 41 world_size: 2 "
      "shrink_only: true data: \"{}\" commit_failures: 3 } "
      "participants { replica_id: \"1:bb\" store_address: \"m1:2\" step: -1 world_size: 4 } "
      "created { seconds: 1700000000 nanos: 5 } }");
  const titan::dist::detail::TorchftQuorum q = titan::dist::detail::decode_quorum_response(bytes);
  CHECK(q.quorum_id == 17);
  REQUIRE(q.participants.size() == 2);
  CHECK(q.participants[0].replica_id == "0:aa");
  CHECK(q.participants[0].store_address == "m0:2");
  CHECK(q.participants[0].step == 41);
  CHECK(q.participants[0].world_size == 2);
  CHECK(q.participants[0].commit_failures == 3);
  CHECK(q.participants[1].replica_id == "1:bb");
  CHECK(q.participants[1].store_address == "m1:2");
  CHECK(q.participants[1].step == -1);
  CHECK(q.participants[1].world_size == 4);
  CHECK(q.participants[1].commit_failures == 0);
  // Cut short, or no quorum at all: an error, not a quorum of nobody.
  CHECK_THROWS_WITH(titan::dist::detail::decode_quorum_response(bytes.substr(0, bytes.size() - 3)),
                    Catch::Matchers::Contains("cut short"));
  CHECK_THROWS_WITH(titan::dist::detail::decode_quorum_response(""), Catch::Matchers::Contains("without its quorum"));
}
