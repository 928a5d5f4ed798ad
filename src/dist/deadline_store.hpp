// SPDX-License-Identifier: BSD-3-Clause
// Private: store calls with a deadline, for the flight recorder and the heartbeat (src/dist/flight_recorder.cpp) and
// the strict backend's rule keeping (src/dist/strict_backend.cpp).
// A host cut off from the store's host (a partition: no reset, no answer) leaves c10d's TCPStore waiting
// in recv far past any useful time, and the failure path that asks the store who is to blame would hang
// with it. Each call here runs on the store's helper thread; the caller waits at most the deadline and then throws
// "the store at HOST:PORT unreachable". While a call that missed its deadline is still outstanding, every
// other call throws at once (the connection serves one request at a time); once it returns the store is
// usable again, unless it failed (its connection may then be out of step, so it stays unreachable).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace titan::dist::detail {

/// What a DeadlineStore call throws when the store does not answer in time (or did not, earlier).
class StoreUnreachable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A store whose calls wait at most `deadline`. Cheap to copy; copies share the state.
class DeadlineStore {
 public:
  DeadlineStore() = default;
  /// `store` as it is (not cloned); `where` names it in errors ("the store at 198.18.0.1:29500").
  DeadlineStore(c10::intrusive_ptr<c10d::Store> store, std::string where, std::chrono::milliseconds deadline);
  /// A connection of its own to the TCP store under `store` (a clone, so a call of another thread holding
  /// the first one, such as a blocking get, never delays these); `store` itself for any other store.
  /// Throws what c10d throws when the clone cannot connect.
  static DeadlineStore own_connection(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds deadline);

  explicit operator bool() const { return state_ != nullptr; }
  /// "the store at HOST:PORT" for a TCP store, "the store" for another kind.
  const std::string& where() const;
  std::chrono::milliseconds deadline() const;
  /// True while a call that missed its deadline is outstanding, or after one failed late.
  bool unreachable() const;

  void set(const std::string& key, const std::string& value) const;
  std::string get(const std::string& key) const;
  int64_t add(const std::string& key, int64_t delta) const;
  bool check(const std::vector<std::string>& keys) const;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) const;
  void delete_key(const std::string& key) const;

  struct State;

 private:
  std::shared_ptr<State> state_{};
};

/// True when a TCP store is under `store` (through prefixes): its calls cross a network.
bool over_network(const c10::intrusive_ptr<c10d::Store>& store);

/// "the store at HOST:PORT" ("[HOST]:PORT" for IPv6) for the TCP store under `store` (through prefixes);
/// "the store" for another kind.
std::string store_name(const c10::intrusive_ptr<c10d::Store>& store);

/// The deadline of the failure path's store calls for a collective timeout `timeout`: half of it, within
/// 2..10 s. Long enough for a store under load (its answers take milliseconds), short enough that a cut-off
/// rank reports and exits well within the timeout + 10 s.
std::chrono::milliseconds store_deadline(std::chrono::milliseconds timeout);

}  // namespace titan::dist::detail
