// SPDX-License-Identifier: BSD-3-Clause
// titan-lighthouse: the store the replica groups of a fault-tolerant job meet in (TorchFT's lighthouse).
// Start it once, outside every replica group, and give its address to each group as
// fault_tolerance.lighthouse (or TITAN_FT_LIGHTHOUSE). It holds no training state: the quorum of each
// step, the commit votes and the rendezvous of the cross-replica groups. See docs/fault_tolerance.md.
//   titan-lighthouse --port 29510        (--port 0: a free port, printed)
#include <fmt/format.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "titan/core/error.hpp"
#include "titan/dist/store.hpp"

int main(int argc, char** argv) {
  int port = 29510;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--port" && i + 1 < argc) {
      port = std::atoi(argv[++i]);
    } else {
      fmt::print(stderr, "usage: titan-lighthouse [--port P]   (P = 0: any free port)\n");
      return arg == "--help" || arg == "-h" ? 0 : 1;
    }
  }
  // Blocked before the store's threads start, so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  try {
    const titan::dist::Store store = titan::dist::Store::serve(port, std::chrono::minutes(10));
    fmt::print("titan-lighthouse: serving on port {}\n", store.port());
    std::fflush(stdout);
    int signal = 0;
    sigwait(&stop, &signal);
    fmt::print("titan-lighthouse: stopped by signal {}\n", signal);
  } catch (const std::exception& e) {
    fmt::print(stderr, "titan-lighthouse: {}\n", titan::error_message(e));
    return 1;
  }
  return 0;
}
