// SPDX-License-Identifier: BSD-3-Clause
// This machine's name, for the files the metrics sinks name after it (event files) or record (W&B runs).
#pragma once

#include <unistd.h>

#include <string>

namespace titan::detail {

inline std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace titan::detail
