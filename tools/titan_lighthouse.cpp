// SPDX-License-Identifier: BSD-3-Clause
// titan-lighthouse: the store the replica groups of a fault-tolerant job meet in (TorchFT's lighthouse).
// Start it once, outside every replica group, and give its address to each group as
// fault_tolerance.lighthouse (or TITAN_FT_LIGHTHOUSE). It holds no training state: the quorum of each
// step, the commit votes and the rendezvous of the cross-replica groups. See docs/fault_tolerance.md.
//   titan-lighthouse --port 29510        (--port 0: a free port, printed)
//   titan-lighthouse --job.config_file run.toml      (the port of the job's fault_tolerance.lighthouse)
#include <fmt/format.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "titan/core/error.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/dist/store.hpp"

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-lighthouse",
    .usage = "usage: titan-lighthouse [--port P] [--fault_tolerance.lighthouse HOST:PORT | --job.config_file FILE]\n",
    .flags = {{.name = "--port",
               .value = "P",
               .help = "the port to serve on; 0: any free port, printed (default: the port of "
                       "fault_tolerance.lighthouse, else 29510)"}},
    .keys = "fault_tolerance.lighthouse (its port)"};

// The port of `address` (host:port); `fallback` when it is empty.
int64_t port_of(const std::string& address, int64_t fallback) {
  if (address.empty()) return fallback;
  const size_t colon = address.rfind(':');
  size_t used = 0;
  int64_t port = -1;
  try {
    port = std::stoll(address.substr(colon + 1), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TITAN_CHECK_VALUE(colon != std::string::npos && used > 0 && colon + 1 + used == address.size(),
                    "[titan-lighthouse] expected fault_tolerance.lighthouse as host:port, got '{}'.", address);
  return port;
}

}  // namespace

int main(int argc, char** argv) {
  // Blocked before the store's threads start, so only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return titan::run_tool(kSpec, argc, argv, [&](const titan::ToolArgs& args) {
    const int64_t port = args.integer("--port", port_of(args.config.fault_tolerance.lighthouse, 29510));
    TITAN_CHECK_VALUE(port >= 0 && port <= 65535, "[titan-lighthouse] expected --port in [0, 65535], got {}.", port);
    const titan::dist::Store store = titan::dist::Store::serve(static_cast<int>(port), std::chrono::minutes(10));
    fmt::print("titan-lighthouse: serving on port {}\n", store.port());
    std::fflush(stdout);
    int signal = 0;
    sigwait(&stop, &signal);
    fmt::print("titan-lighthouse: stopped by signal {}\n", signal);
    return 0;
  });
}
