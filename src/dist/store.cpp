// SPDX-License-Identifier: BSD-3-Clause
#include "titan/dist/store.hpp"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "store_impl.hpp"
#include "titan/core/error.hpp"

namespace titan::dist {

Store Store::tcp(const std::string& host, int port, bool is_server, int64_t world_size,
                 std::chrono::milliseconds timeout) {
  TITAN_CHECK_VALUE(port > 0 && port < 65536,
                    "[titan::dist::Store] expected a TCP port in 1..65535, got {}. Set MASTER_PORT.", port);
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = is_server;
  options.numWorkers = static_cast<size_t>(world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  try {
    return Store(
        std::make_shared<detail::StoreImpl>(detail::StoreImpl{c10::make_intrusive<c10d::TCPStore>(host, options)}));
  } catch (const std::exception& e) {
    TITAN_CHECK(false,
                "[titan::dist::Store] expected to {} the rendezvous store at {}:{} with {} ranks within {} s, got: "
                "{}. Check MASTER_ADDR/MASTER_PORT and that every rank was started with the same WORLD_SIZE.",
                is_server ? "serve" : "reach", host, port, world_size, timeout.count() / 1000, error_message(e));
  }
  return Store(nullptr);  // unreachable
}

Store Store::serve(int port, std::chrono::milliseconds timeout) {
  TITAN_CHECK_VALUE(port >= 0 && port < 65536, "[titan::dist::Store] expected a TCP port in 0..65535, got {}.", port);
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    return Store(std::make_shared<detail::StoreImpl>(
        detail::StoreImpl{c10::make_intrusive<c10d::TCPStore>("0.0.0.0", options)}));
  } catch (const std::exception& e) {
    TITAN_CHECK(false, "[titan::dist::Store] expected to serve a store on port {}, got: {}. Pick a free port.", port,
                error_message(e));
  }
  return Store(nullptr);  // unreachable
}

int Store::port() const {
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(impl_->store.get());
  return tcp == nullptr ? -1 : static_cast<int>(tcp->getPort());
}

Store Store::in_memory() {
  return Store(std::make_shared<detail::StoreImpl>(detail::StoreImpl{c10::make_intrusive<c10d::HashStore>()}));
}

Store Store::prefixed(const std::string& prefix) const {
  return Store(std::make_shared<detail::StoreImpl>(
      detail::StoreImpl{c10::make_intrusive<c10d::PrefixStore>(prefix, impl_->store)}));
}

void Store::set(const std::string& key, const std::string& value) const {
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::get(const std::string& key) const {
  const std::vector<uint8_t> bytes = impl_->store->get(key);
  return {bytes.begin(), bytes.end()};
}

int64_t Store::add(const std::string& key, int64_t delta) const { return impl_->store->add(key, delta); }

}  // namespace titan::dist
