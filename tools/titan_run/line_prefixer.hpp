// SPDX-License-Identifier: BSD-3-Clause
// Turns one rank's output stream into whole lines prefixed "[rank R] ", written with one write() per
// batch of lines, so lines of different ranks never mix mid-line on the launcher's stdout/stderr.
#pragma once

#include <cstddef>
#include <string>

namespace titan_run {

class LinePrefixer {
 public:
  LinePrefixer(std::string prefix, int out_fd) : prefix_(std::move(prefix)), out_fd_(out_fd) {}

  /// Adds bytes read from the rank; writes every line completed so far.
  void feed(const char* data, std::size_t size);
  /// Writes a last line without its newline (the rank exited mid-line).
  void finish();

 private:
  void flush_lines(std::string& out);

  std::string prefix_;
  int out_fd_;
  std::string partial_;  // bytes after the last newline
};

/// write() all of `data` to `fd`, retrying short writes; output errors are ignored (nowhere to report).
void write_all(int fd, const std::string& data);

/// One line of titan-run's own on stderr, "titan-run: <message>".
void say(const std::string& message);

}  // namespace titan_run
