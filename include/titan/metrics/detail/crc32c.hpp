// SPDX-License-Identifier: BSD-3-Clause
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and the masking TFRecord files apply to it,
// for TensorBoard's event files. Table-driven and constexpr: a few hundred bytes per logged step.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace titan::detail {

inline constexpr std::array<uint32_t, 256> kCrc32cTable = [] {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}();

/// CRC-32C of `bytes` (initial value and final xor 0xFFFFFFFF): crc32c("123456789") == 0xE3069283.
constexpr uint32_t crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) crc = kCrc32cTable[(crc ^ static_cast<uint8_t>(c)) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

/// TFRecord's masked CRC: rotate right by 15 bits, add a constant (a CRC of data that holds CRCs
/// is then not a CRC of the same kind).
constexpr uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

/// The inverse of mask_crc32c.
constexpr uint32_t unmask_crc32c(uint32_t masked) {
  const uint32_t rotated = masked - 0xA282EAD8u;
  return (rotated >> 17) | (rotated << 15);
}

}  // namespace titan::detail
