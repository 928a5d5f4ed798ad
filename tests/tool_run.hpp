// SPDX-License-Identifier: BSD-3-Clause
// Runs one of the built tools (build/bin/<name>) to its end: its exit status and its output (stdout and stderr).
#pragma once

#include <string>
#include <vector>

#include "dist/subprocess.hpp"
#include "test_util.hpp"

namespace titan::test {

struct ToolRun {
  /// The exit status.
  int code = -1;
  /// stdout and stderr together.
  std::string output{};
};

inline ToolRun run_tool(const std::string& name, std::vector<std::string> args, double seconds = 120) {
  args.insert(args.begin(), (binary_dir() / "bin" / name).string());
  Subprocess tool(args, {});
  const auto status = tool.wait(seconds);
  INFO(tool.output());
  REQUIRE(status);
  return {exit_code(*status), tool.output()};
}

}  // namespace titan::test
