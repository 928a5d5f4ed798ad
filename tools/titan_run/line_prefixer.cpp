// SPDX-License-Identifier: BSD-3-Clause
#include "line_prefixer.hpp"

#include <unistd.h>
#include <cerrno>

namespace titan_run {

// A rank that prints a huge line without a newline still gets it out, in pieces of this size.
constexpr std::size_t kMaxPartial = 64 * 1024;

void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "titan-run: " + message + "\n"); }

void LinePrefixer::feed(const char* data, std::size_t size) {
  std::string out;
  for (std::size_t i = 0; i < size; ++i) {
    partial_ += data[i];
    if (data[i] == '\n' || partial_.size() >= kMaxPartial) flush_lines(out);
  }
  write_all(out_fd_, out);
}

void LinePrefixer::flush_lines(std::string& out) {
  out += prefix_;
  out += partial_;
  if (out.back() != '\n') out += '\n';
  partial_.clear();
}

void LinePrefixer::finish() {
  if (partial_.empty()) return;
  std::string out;
  flush_lines(out);
  write_all(out_fd_, out);
}

}  // namespace titan_run
