// SPDX-License-Identifier: BSD-3-Clause
// TorchFT's lighthouse messages in protobuf's wire format (grpc/torchft.proto holds the field numbers): a field is a
// varint key (number << 3 | wire type) then a varint (type 0), 8 bytes (1), a varint length and bytes (2), or 4
// bytes (5). proto3 leaves out fields at their default value; a reader skips the fields it does not know.
#include <stdexcept>

#include "torchft_client.hpp"

namespace titan::dist::detail {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

// int64, uint64 and bool are all varints (a negative int64 as its two's complement, ten bytes).
void put_number(std::string& out, uint32_t field, uint64_t value) {
  if (value == 0) return;
  put_key(out, field, kVarint);
  put_varint(out, value);
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes, bool always = false) {
  if (bytes.empty() && !always) return;
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out += bytes;
}

// QuorumMember: replica_id 1, address 2, store_address 3, step 4, world_size 5, shrink_only 6, data 7,
// commit_failures 8.
std::string encode_member(const TorchftMember& m) {
  std::string out;
  put_bytes(out, 1, m.replica_id);
  put_bytes(out, 3, m.store_address);
  put_number(out, 4, static_cast<uint64_t>(m.step));
  put_number(out, 5, m.world_size);
  put_number(out, 8, static_cast<uint64_t>(m.commit_failures));
  return out;
}

// One message's fields, read in order.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  bool done() const { return at_ == bytes_.size(); }

  // The next field's number and type; its value is read by varint() or bytes(), or passed by skip().
  std::pair<uint32_t, uint32_t> key() {
    const uint64_t key = varint();
    return {static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7)};
  }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto byte = static_cast<uint8_t>(bytes_[at_++]);
      value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return value;
    }
    throw std::runtime_error("a varint longer than 10 bytes");
  }

  std::string_view bytes() {
    const uint64_t n = varint();
    need(n);
    const std::string_view out = bytes_.substr(at_, n);
    at_ += n;
    return out;
  }

  void skip(uint32_t type) {
    switch (type) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        need(8);
        at_ += 8;
        return;
      case kBytes:
        bytes();
        return;
      case kFixed32:
        need(4);
        at_ += 4;
        return;
      default:
        throw std::runtime_error("wire type " + std::to_string(type));
    }
  }

 private:
  void need(uint64_t n) const {
    if (n > bytes_.size() - at_) throw std::runtime_error("a message cut short");
  }

  std::string_view bytes_;
  size_t at_ = 0;
};

TorchftMember decode_member(std::string_view bytes) {
  TorchftMember m;
  Reader in(bytes);
  while (!in.done()) {
    const auto [field, type] = in.key();
    if (field == 1 && type == kBytes) {
      m.replica_id = in.bytes();
    } else if (field == 3 && type == kBytes) {
      m.store_address = in.bytes();
    } else if (field == 4 && type == kVarint) {
      m.step = static_cast<int64_t>(in.varint());
    } else if (field == 5 && type == kVarint) {
      m.world_size = in.varint();
    } else if (field == 8 && type == kVarint) {
      m.commit_failures = static_cast<int64_t>(in.varint());
    } else {
      in.skip(type);
    }
  }
  return m;
}

// Quorum: quorum_id 1, participants 2, created 3.
TorchftQuorum decode_quorum(std::string_view bytes) {
  TorchftQuorum q;
  Reader in(bytes);
  while (!in.done()) {
    const auto [field, type] = in.key();
    if (field == 1 && type == kVarint) {
      q.quorum_id = static_cast<int64_t>(in.varint());
    } else if (field == 2 && type == kBytes) {
      q.participants.push_back(decode_member(in.bytes()));
    } else {
      in.skip(type);
    }
  }
  return q;
}

}  // namespace

std::string encode_quorum_request(const TorchftMember& me) {
  std::string out;
  put_bytes(out, 1, encode_member(me), /*always=*/true);  // requester: present even when empty
  return out;
}

std::string encode_heartbeat_request(const std::string& replica_id) {
  std::string out;
  put_bytes(out, 1, replica_id);
  return out;
}

TorchftQuorum decode_quorum_response(const std::string& bytes) {
  TorchftQuorum q;
  bool found = false;
  Reader in(bytes);
  while (!in.done()) {
    const auto [field, type] = in.key();
    if (field == 1 && type == kBytes) {
      q = decode_quorum(in.bytes());
      found = true;
    } else {
      in.skip(type);
    }
  }
  if (!found) throw std::runtime_error("a LighthouseQuorumResponse without its quorum");
  return q;
}

}  // namespace titan::dist::detail
