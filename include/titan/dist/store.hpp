// SPDX-License-Identifier: BSD-3-Clause
// The rendezvous key-value store every process group is built over. A thin handle so that c10d's
// headers stay out of everything that includes titan: TCP across processes, in-memory across
// threads (the test harness runs N ranks as threads of one process).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace titan::dist {

namespace detail {
struct StoreImpl;
}

/// A shared key-value store (c10d::Store underneath); cheap to copy.
class Store {
 public:
  /// TCP store: rank 0 serves on host:port, the others connect; waits until world_size joined.
  static Store tcp(const std::string& host, int port, bool is_server, int64_t world_size,
                   std::chrono::milliseconds timeout);
  /// TCP store server that waits for nobody (the fault-tolerance lighthouse); port 0 picks a free port.
  static Store serve(int port, std::chrono::milliseconds timeout);
  /// The port of a TCP store (tcp() or serve()); -1 for any other.
  int port() const;
  /// In-process store shared by every thread holding a copy (ranks as threads).
  static Store in_memory();

  /// A view whose keys all start with prefix + "/" (one per process group, so groups never clash).
  Store prefixed(const std::string& prefix) const;

  void set(const std::string& key, const std::string& value) const;
  /// Blocks until key exists (or the store's timeout).
  std::string get(const std::string& key) const;
  /// Atomic add; returns the new value.
  int64_t add(const std::string& key, int64_t delta) const;

  const std::shared_ptr<detail::StoreImpl>& impl() const { return impl_; }

 private:
  explicit Store(std::shared_ptr<detail::StoreImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<detail::StoreImpl> impl_;
};

}  // namespace titan::dist
