// SPDX-License-Identifier: BSD-3-Clause
#include "preemption_signals.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string_view>

#include "titan/core/error.hpp"
#include "titan/dist/heartbeat.hpp"

namespace titan::detail {
namespace {

// Read and written by the handler: lock-free atomics and plain ints set before the handler is installed.
std::atomic<int> g_received{0};
constexpr int kMaxSignals = 8;
int g_armed[kMaxSignals] = {};
int g_armed_count = 0;

struct Installed {
  std::mutex mutex;
  int users = 0;
  struct sigaction previous[kMaxSignals] = {};
};
Installed& installed() {
  static Installed state;
  return state;
}

// Async-signal-safe: an atomic store and sigaction. The default action comes back for every armed signal,
// so the next one (SIGTERM twice, or SIGUSR1 then SIGTERM) ends the process as if nothing were caught.
extern "C" void on_preemption_signal(int sig) {
  int expected = 0;
  g_received.compare_exchange_strong(expected, sig);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int i = 0; i < g_armed_count; ++i) sigaction(g_armed[i], &dfl, nullptr);
}

void arm() {
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < g_armed_count; ++i) sigaction(g_armed[i], &action, nullptr);
}

int parse_signal(const std::string& name) {
  const std::string_view bare = std::string_view(name).starts_with("SIG") ? std::string_view(name).substr(3) : name;
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev != nullptr && bare == abbrev) {
      TITAN_CHECK(sig != SIGKILL && sig != SIGSTOP,
                  "[titan::PreemptionSignals] expected a signal that can be caught, got {}. Remove it from "
                  "checkpoint.preemption_signals.",
                  name);
      return sig;
    }
  }
  TITAN_CHECK(false,
              "[titan::PreemptionSignals] expected signal names such as SIGTERM or SIGUSR1, got '{}'. Fix "
              "checkpoint.preemption_signals.",
              name);
  return 0;
}

}  // namespace

PreemptionSignals::PreemptionSignals(const std::vector<std::string>& names) {
  std::vector<int> signals;
  for (const auto& name : names) signals.push_back(parse_signal(name));
  TITAN_CHECK(signals.size() <= static_cast<size_t>(kMaxSignals),
              "[titan::PreemptionSignals] expected at most {} signals, got {}. Shorten checkpoint.preemption_signals.",
              kMaxSignals, signals.size());
  Installed& state = installed();
  const std::lock_guard lock(state.mutex);
  if (state.users++ > 0) return;  // already armed by another trainer in this process
  g_armed_count = 0;
  for (int sig : signals) {
    sigaction(sig, nullptr, &state.previous[g_armed_count]);
    g_armed[g_armed_count++] = sig;
  }
  arm();
}

PreemptionSignals::~PreemptionSignals() {
  Installed& state = installed();
  const std::lock_guard lock(state.mutex);
  if (--state.users > 0) return;
  for (int i = 0; i < g_armed_count; ++i) sigaction(g_armed[i], &state.previous[i], nullptr);
  g_armed_count = 0;
}

int PreemptionSignals::received() { return g_received.load(); }

void PreemptionSignals::reset() {
  Installed& state = installed();
  const std::lock_guard lock(state.mutex);
  g_received.store(0);
  if (state.users > 0) arm();
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

int64_t restart_count() {
  for (const char* name : {"TITAN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return std::atoll(value);
  }
  return 0;
}

void record_restart(const std::filesystem::path& dump_folder, int64_t resume_step, int64_t world_size) {
  const int64_t count = restart_count();
  if (count == 0) return;
  const char* reason = std::getenv("TITAN_RESTART_REASON");
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const nlohmann::json record = {{"restart_count", count},
                                 {"reason", reason != nullptr ? reason : ""},
                                 {"resume_step", resume_step},
                                 {"world_size", world_size},
                                 {"time", std::chrono::duration<double>(now).count()}};
  std::filesystem::create_directories(dump_folder);
  std::ofstream out(dump_folder / "restarts.jsonl", std::ios::app);
  out << record.dump() << '\n';
  TITAN_CHECK(out.good(), "[titan::record_restart] expected to append to {}, got a write error. Check the folder.",
              (dump_folder / "restarts.jsonl").string());
}

void inject_step_faults(const testing::Faults& faults, int64_t rank, int64_t step) {
  if (faults.kill && faults.kill->rank == rank && faults.kill->at == step) raise(SIGKILL);
  if (faults.hang && faults.hang->rank == rank && faults.hang->at == step) dist::hang_in_next_collective_for_test();
}

}  // namespace titan::detail
