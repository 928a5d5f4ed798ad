// SPDX-License-Identifier: BSD-3-Clause
// titan-run: starts N ranks with torchrun's environment and supervises them. See docs/launch.md.
#include "line_prefixer.hpp"
#include "options.hpp"
#include "supervisor.hpp"

#include <unistd.h>
#include <exception>
#include <stdexcept>

int main(int argc, char** argv) {
  titan_run::Options options;
  try {
    options = titan_run::parse_options(argc, argv);
  } catch (const std::invalid_argument& e) {
    const std::string message = std::string("titan-run: ") + e.what() + "\nrun 'titan-run --help' for the usage\n";
    titan_run::write_all(STDERR_FILENO, message);
    return 2;
  }
  if (options.help) {
    titan_run::write_all(STDOUT_FILENO, titan_run::usage());
    return 0;
  }
  for (const std::string& warning : titan_run::warnings(options)) {
    titan_run::write_all(STDERR_FILENO, "titan-run: " + warning + "\n");
  }
  try {
    return titan_run::supervise(options);
  } catch (const std::exception& e) {
    titan_run::write_all(STDERR_FILENO, std::string("titan-run: ") + e.what() + "\n");
    return 1;
  }
}
