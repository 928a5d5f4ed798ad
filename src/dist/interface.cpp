// SPDX-License-Identifier: BSD-3-Clause
#include "interface.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "titan/core/error.hpp"
#include "titan/dist/launch_env.hpp"

namespace titan::dist::detail {
namespace {

std::string address_text(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

std::string describe(const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> parts;
  for (const NetInterface& i : interfaces) {
    parts.push_back(i.addresses.empty() ? i.name + " (no address)"
                                        : fmt::format("{} ({})", i.name, fmt::join(i.addresses, ", ")));
  }
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

std::vector<NetInterface> net_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    auto it = std::find_if(out.begin(), out.end(), [&](const NetInterface& i) { return i.name == a->ifa_name; });
    if (it == out.end()) it = out.insert(out.end(), NetInterface{.name = a->ifa_name, .addresses = {}});
    if (a->ifa_addr != nullptr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6)) {
      it->addresses.push_back(address_text(a->ifa_addr));
    }
  }
  freeifaddrs(list);
  return out;
}

std::vector<std::string> split_ifnames(const std::string& value) {
  std::vector<std::string> names;
  std::size_t start = 0;
  while (start <= value.size()) {
    const std::size_t comma = std::min(value.find(',', start), value.size());
    std::string name = value.substr(start, comma - start);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) names.push_back(std::move(name));
    start = comma + 1;
  }
  return names;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* results = nullptr;
  // Any port: connect() on a UDP socket only consults the routing table.
  const int rc = getaddrinfo(host.c_str(), "9", &hints, &results);
  TITAN_CHECK_VALUE(rc == 0,
                    "[titan::dist] expected the rendezvous host '{}' (MASTER_ADDR) to resolve, got: {}. Use an "
                    "address or a name every host resolves.",
                    host, gai_strerror(rc));
  std::string error = "no address";
  std::string local;
  for (const addrinfo* r = results; r != nullptr && local.empty(); r = r->ai_next) {
    const int fd = socket(r->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage mine{};
    socklen_t length = sizeof(mine);
    if (connect(fd, r->ai_addr, r->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &length) == 0) {
      local = address_text(reinterpret_cast<const sockaddr*>(&mine));
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(results);
  TITAN_CHECK_VALUE(!local.empty(),
                    "[titan::dist] expected a route from this host to the rendezvous host '{}' (MASTER_ADDR), got: "
                    "{}. Check the address, or name the interface to use with GLOO_SOCKET_IFNAME.",
                    host, error);
  return local;
}

std::string store_host(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> base = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(base.get())) base = prefixed->getUnderlyingNonPrefixStore();
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(base.get());
  return tcp == nullptr ? "" : tcp->getHost();
}

bool is_loopback_address(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

void check_ifnames(const std::vector<std::string>& names, const std::vector<NetInterface>& interfaces) {
  for (const std::string& name : names) {
    const auto it =
        std::find_if(interfaces.begin(), interfaces.end(), [&](const NetInterface& i) { return i.name == name; });
    TITAN_CHECK_VALUE(it != interfaces.end(),
                      "[titan::dist] expected GLOO_SOCKET_IFNAME to name network interfaces of this host, got '{}', "
                      "which does not exist. Interfaces here: {}. Set GLOO_SOCKET_IFNAME to one that reaches the "
                      "other hosts, or unset it to use the one that routes to MASTER_ADDR.",
                      name, describe(interfaces));
    TITAN_CHECK_VALUE(!it->addresses.empty(),
                      "[titan::dist] expected the interface '{}' named by GLOO_SOCKET_IFNAME to have an IPv4 or IPv6 "
                      "address, got none. Interfaces here: {}. Bring it up with an address, or name another.",
                      name, describe(interfaces));
  }
}

void check_gloo_ifname_env() {
  const char* env = std::getenv("GLOO_SOCKET_IFNAME");
  if (env != nullptr) check_ifnames(split_ifnames(env), net_interfaces());
}

std::pair<bool, std::vector<std::string>> gloo_endpoints(const std::string& ifname_env, const std::string& store_host,
                                                         const std::vector<NetInterface>& interfaces,
                                                         bool spans_hosts) {
  const std::vector<std::string> names = split_ifnames(ifname_env);
  if (names.empty()) {
    // A store in memory means one process: loopback, as a store on 127.0.0.1 gives.
    if (store_host.empty()) return {false, {"127.0.0.1"}};
    const std::string local = local_address_towards(store_host);
    TITAN_CHECK_VALUE(!spans_hosts || !is_loopback_address(local) || is_loopback_address(store_host),
                      "[titan::dist] expected MASTER_ADDR '{}' to lead to an address the other hosts of the job reach, "
                      "got {} (loopback) on this host, so Gloo here would be out of their reach. Set MASTER_ADDR to "
                      "this host's address on the network the hosts share (a name that resolves to it everywhere), "
                      "or name that network's interface with GLOO_SOCKET_IFNAME.",
                      store_host, local);
    return {false, {local}};
  }
  check_ifnames(names, interfaces);
  return {true, names};
}

std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const c10::intrusive_ptr<c10d::Store>& store) {
  const char* env = std::getenv("GLOO_SOCKET_IFNAME");
  bool spans_hosts = false;
  try {
    const LaunchEnv launch = read_launch_env();
    spans_hosts = launch.local_world_size < launch.world_size;
  } catch (const c10::ValueError&) {
    // A group built without the launch contract (a test's, a tool's): nothing says the job spans hosts.
  }
  const auto [by_interface, endpoints] =
      gloo_endpoints(env == nullptr ? "" : env, store_host(store), net_interfaces(), spans_hosts);
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  for (const std::string& endpoint : endpoints) {
    // Several devices: ProcessGroupGloo spreads its collectives over them, as PyTorch does for a list.
    devices.push_back(by_interface ? c10d::ProcessGroupGloo::createDeviceForInterface(endpoint)
                                   : c10d::ProcessGroupGloo::createDeviceForHostname(endpoint));
  }
  return devices;
}

}  // namespace titan::dist::detail
