// SPDX-License-Identifier: BSD-3-Clause
// The protobuf wire format of the few field kinds titan writes by hand (TensorBoard's Event, W&B's Record):
// a field is a varint key (field number << 3 | wire type) then its payload: varint (0), 64-bit little-endian
// (1), length-delimited (2: varint length, bytes) or 32-bit little-endian (5). No protobuf library involved.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace titan::detail::pb {

static_assert(std::endian::native == std::endian::little,
              "protobuf and its framings are little-endian; titan writes raw");

enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

inline void put_key(std::string& out, int field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

/// `value`'s bytes as they lie in memory (little-endian): fixed32/fixed64 payloads and framing headers.
template <class T>
void put_raw(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

/// A length-delimited field: a string, bytes or an encoded sub-message.
inline void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

/// A varint field (int32, int64, bool, enum); negative values take 10 bytes, as protobuf's int64.
inline void put_int(std::string& out, int field, int64_t value) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(value));
}

}  // namespace titan::detail::pb
