// SPDX-License-Identifier: BSD-3-Clause
// Which address Gloo connects through (src/dist/interface.cpp): GLOO_SOCKET_IFNAME's interfaces, checked
// against the host's, else the local address that routes to the store's host, loopback for one host; a
// host name that leads to loopback when the job spans hosts is refused.
// The multi-host runs themselves are in tests/multihost/.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include "../../src/dist/interface.hpp"
#include "test_util.hpp"

using Catch::Matchers::Contains;
using titan::dist::detail::gloo_endpoints;
using titan::dist::detail::NetInterface;
using titan::dist::detail::split_ifnames;

namespace {

const std::vector<NetInterface> kHost = {{.name = "lo", .addresses = {"127.0.0.1", "::1"}},
                                         {.name = "eth0", .addresses = {"10.1.2.3"}},
                                         {.name = "ib0", .addresses = {}}};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("GLOO_SOCKET_IFNAME: one name or a comma-separated list with blanks dropped", "[dist][interface]") {
  CHECK(split_ifnames("eth0") == std::vector<std::string>{"eth0"});
  CHECK(split_ifnames(" eth0, eth1 ,") == std::vector<std::string>{"eth0", "eth1"});
  CHECK(split_ifnames("").empty());
  CHECK(split_ifnames(" , ").empty());
}

TEST_CASE("Gloo's endpoint: the named interfaces or else the address towards the store's host", "[dist][interface]") {
  // Named interfaces are used as named.
  CHECK(gloo_endpoints("eth0", "10.1.2.1", kHost) == std::pair<bool, std::vector<std::string>>{true, {"eth0"}});
  CHECK(gloo_endpoints("eth0,lo", "", kHost) == std::pair<bool, std::vector<std::string>>{true, {"eth0", "lo"}});
  // One host: a store in memory or on 127.0.0.1 keeps Gloo on loopback.
  CHECK(gloo_endpoints("", "", kHost) == std::pair<bool, std::vector<std::string>>{false, {"127.0.0.1"}});
  CHECK(gloo_endpoints("", "127.0.0.1", kHost) == std::pair<bool, std::vector<std::string>>{false, {"127.0.0.1"}});
  const auto localhost = gloo_endpoints("", "localhost", kHost).second.at(0);
  CHECK((localhost == "127.0.0.1" || localhost == "::1"));
}

TEST_CASE("a wrong GLOO_SOCKET_IFNAME is named with the interfaces that exist", "[dist][interface]") {
  CHECK(error_of([] { gloo_endpoints("eth7", "10.1.2.1", kHost); }) ==
        "[titan::dist] expected GLOO_SOCKET_IFNAME to name network interfaces of this host, got 'eth7', which does "
        "not exist. Interfaces here: lo (127.0.0.1, ::1), eth0 (10.1.2.3), ib0 (no address). Set GLOO_SOCKET_IFNAME "
        "to one that reaches the other hosts, or unset it to use the one that routes to MASTER_ADDR.");
  CHECK_THAT(error_of([] { gloo_endpoints("eth0,eth7", "", kHost); }), Contains("got 'eth7'"));
  CHECK_THAT(error_of([] { gloo_endpoints("ib0", "", kHost); }),
             Contains("expected the interface 'ib0' named by GLOO_SOCKET_IFNAME to have an IPv4 or IPv6 address, got "
                      "none."));
  // This machine's own list has loopback at least.
  const auto here = titan::dist::detail::net_interfaces();
  CHECK(std::any_of(here.begin(), here.end(), [](const NetInterface& i) { return i.name == "lo"; }));
}

TEST_CASE("a host name that leads to loopback is refused once the job spans hosts", "[dist][interface]") {
  using titan::dist::detail::is_loopback_address;
  CHECK(is_loopback_address("127.0.0.1"));
  CHECK(is_loopback_address("127.0.1.1"));
  CHECK(is_loopback_address("::1"));
  CHECK(is_loopback_address("::ffff:127.0.0.1"));
  CHECK_FALSE(is_loopback_address("198.18.0.1"));
  CHECK_FALSE(is_loopback_address("fd00:7e57::1"));
  CHECK_FALSE(is_loopback_address("localhost"));
  // One host: fine. Several: the name is refused, a loopback literal is taken as meant, and a named
  // interface needs no guess.
  CHECK(gloo_endpoints("", "localhost", kHost, false).first == false);
  CHECK(error_of([] { gloo_endpoints("", "localhost", kHost, true); }) ==
        fmt::format("[titan::dist] expected MASTER_ADDR 'localhost' to lead to an address the other hosts of the job "
                    "reach, got {} (loopback) on this host, so Gloo here would be out of their reach. Set MASTER_ADDR "
                    "to this host's address on the network the hosts share (a name that resolves to it everywhere), "
                    "or name that network's interface with GLOO_SOCKET_IFNAME.",
                    titan::dist::detail::local_address_towards("localhost")));
  CHECK(gloo_endpoints("", "127.0.0.1", kHost, true) ==
        std::pair<bool, std::vector<std::string>>{false, {"127.0.0.1"}});
  CHECK(gloo_endpoints("lo", "localhost", kHost, true) == std::pair<bool, std::vector<std::string>>{true, {"lo"}});
}

TEST_CASE("a rendezvous host that does not resolve is named", "[dist][interface]") {
  CHECK_THAT(error_of([] { titan::dist::detail::local_address_towards("no-such-host.invalid"); }),
             Contains("expected the rendezvous host 'no-such-host.invalid' (MASTER_ADDR) to resolve"));
}

TEST_CASE("the store's host is found through prefixes and a store in memory has none", "[dist][interface]") {
  c10d::TCPStoreOptions options;
  options.port = 0;  // any free port
  options.isServer = true;
  options.waitWorkers = false;
  auto tcp = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("a", c10::make_intrusive<c10d::PrefixStore>("b", tcp));
  CHECK(titan::dist::detail::store_host(prefixed) == "127.0.0.1");
  CHECK(titan::dist::detail::store_host(c10::make_intrusive<c10d::HashStore>()).empty());
}
