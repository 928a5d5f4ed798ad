// SPDX-License-Identifier: BSD-3-Clause
// Private: which network interface a process's Gloo connections use. Gloo binds one address and tells
// the other ranks to connect to it, so on several hosts it must be one they can reach: the interface
// GLOO_SOCKET_IFNAME names (PyTorch's rule), or else the address this host uses to reach the
// rendezvous store's host. A store on 127.0.0.1 (one host) keeps Gloo on loopback. See docs/launch.md.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gloo::transport {
class Device;
}

namespace titan::dist::detail {

/// An interface of this host and its IPv4/IPv6 addresses, as getifaddrs lists them.
struct NetInterface {
  std::string name;
  std::vector<std::string> addresses;
};

/// This host's interfaces, in the order the kernel lists them.
std::vector<NetInterface> net_interfaces();

/// The interface names in GLOO_SOCKET_IFNAME's value ("eth0" or "eth0,eth1"; blanks dropped).
std::vector<std::string> split_ifnames(const std::string& value);

/// The local address the kernel picks to send to `host` (a name or an IPv4/IPv6 literal): what the
/// routing table says, found by connecting a UDP socket (no packet is sent). Throws c10::ValueError
/// naming the host when it does not resolve or no route leads there.
std::string local_address_towards(const std::string& host);

/// The host of the TCP store under `store` (through prefixes); "" for a store in memory.
std::string store_host(const c10::intrusive_ptr<c10d::Store>& store);

/// True for a loopback address literal (127.0.0.0/8, ::1, ::ffff:127.x.y.z); false for names.
bool is_loopback_address(const std::string& address);

/// Fails naming the interfaces of this host when one of `names` is missing or has no address.
void check_ifnames(const std::vector<std::string>& names, const std::vector<NetInterface>& interfaces);

/// check_ifnames on GLOO_SOCKET_IFNAME's value, if set: before the store, so a host whose ranks all fail
/// here cannot leave the other hosts waiting on a store that has gone.
void check_gloo_ifname_env();

/// How Gloo connects: the interfaces named by `ifname_env` (GLOO_SOCKET_IFNAME's value; checked
/// against `interfaces`, an unknown name throws c10::ValueError listing those that exist), else the
/// local address towards `store_host` ("127.0.0.1" when there is no TCP store). `.first` is true for
/// interface names, false for one address. When the job `spans_hosts` (fewer local ranks than ranks), a
/// host name that leads to loopback here (Debian maps a machine's own name to 127.0.1.1) throws: the
/// other hosts could not reach Gloo on this one. A loopback literal is taken as meant (hosts simulated
/// on one machine).
std::pair<bool, std::vector<std::string>> gloo_endpoints(const std::string& ifname_env, const std::string& store_host,
                                                         const std::vector<NetInterface>& interfaces,
                                                         bool spans_hosts = false);

/// The Gloo devices for a group whose store is `store`, by gloo_endpoints with this process's
/// GLOO_SOCKET_IFNAME and interfaces.
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const c10::intrusive_ptr<c10d::Store>& store);

}  // namespace titan::dist::detail
