// SPDX-License-Identifier: BSD-3-Clause
// Error checks for titan: c10 exceptions (so LibTorch's and titan's errors look alike) with messages
// built by fmt only when a check fails. Message template:
//   [titan::<where>] expected <X>, got <Y>. <how to fix>
#pragma once

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <string>

namespace titan {

/// A configuration error; `key()` is the dotted path of the offending key (e.g. `training.steps`).
class ConfigError : public c10::ValueError {
 public:
  ConfigError(std::string key, const std::string& msg)
      : c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg), key_(std::move(key)) {}
  const std::string& key() const noexcept { return key_; }

 private:
  std::string key_;
};

/// The message of an exception without LibTorch's C++ backtrace (for logs and mains).
inline std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace titan

// TITAN_CHECK(cond, "[titan::where] expected {}, got {}. fix", a, b): throws c10::Error.
#define TITAN_CHECK(cond, ...)                        \
  do {                                                \
    if (C10_UNLIKELY_OR_CONST(!(cond))) {             \
      TORCH_CHECK(false, ::fmt::format(__VA_ARGS__)); \
    }                                                 \
  } while (0)

// Caller passed a bad value: throws c10::ValueError.
#define TITAN_CHECK_VALUE(cond, ...)                        \
  do {                                                      \
    if (C10_UNLIKELY_OR_CONST(!(cond))) {                   \
      TORCH_CHECK_VALUE(false, ::fmt::format(__VA_ARGS__)); \
    }                                                       \
  } while (0)

// Not built / not supported here: throws c10::NotImplementedError.
#define TITAN_CHECK_NOT_IMPLEMENTED(cond, ...)                        \
  do {                                                                \
    if (C10_UNLIKELY_OR_CONST(!(cond))) {                             \
      TORCH_CHECK_NOT_IMPLEMENTED(false, ::fmt::format(__VA_ARGS__)); \
    }                                                                 \
  } while (0)
