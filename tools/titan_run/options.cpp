// SPDX-License-Identifier: BSD-3-Clause
#include "options.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <charconv>
#include <sstream>
#include <stdexcept>

namespace titan_run {
namespace {

// Bounds keep node_rank * nproc_per_node + local_rank within int and the grace period finite.
template <typename T>
T parse_number(const std::string& flag, const std::string& text, T min_value, T max_value) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  // Written so that NaN fails too.
  if (text.empty() || ec != std::errc() || ptr != end || !(value >= min_value && value <= max_value)) {
    std::ostringstream message;
    message << flag << " expects a number in [" << min_value << ", " << max_value << "], got '" << text << "'";
    throw std::invalid_argument(message.str());
  }
  return value;
}

// "MIN:MAX" (elastic) or "N".
void parse_nnodes(const std::string& flag, const std::string& text, Options& o) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    o.nnodes = parse_number<int>(flag, text, 1, 100000);
    return;
  }
  o.elastic = true;
  o.min_nodes = parse_number<int>(flag + " MIN", text.substr(0, colon), 1, 100000);
  o.max_nodes = parse_number<int>(flag + " MAX", text.substr(colon + 1), 1, 100000);
  if (o.min_nodes > o.max_nodes) {
    throw std::invalid_argument(flag + " MIN:MAX expects MIN <= MAX, got '" + text + "'");
  }
  o.nnodes = o.max_nodes;
}

// torchrun's "key=value,key=value"; titan-run reads join_timeout and last_call_timeout (seconds),
// keep_alive_interval (seconds) and keep_alive_max_attempt.
void parse_rdzv_conf(const std::string& flag, const std::string& text, Options& o) {
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "join_timeout") {
      o.join_timeout_seconds = parse_number<double>(flag + " join_timeout", value, 0.0, 86400.0);
    } else if (key == "last_call_timeout") {
      o.last_call_timeout_seconds = parse_number<double>(flag + " last_call_timeout", value, 0.0, 86400.0);
    } else if (key == "keep_alive_interval") {
      o.keep_alive_interval_seconds = parse_number<int>(flag + " keep_alive_interval", value, 1, 3600);
    } else if (key == "keep_alive_max_attempt") {
      o.keep_alive_max_attempt = parse_number<int>(flag + " keep_alive_max_attempt", value, 1, 100);
    } else {
      throw std::invalid_argument(flag +
                                  " knows join_timeout, last_call_timeout, keep_alive_interval and "
                                  "keep_alive_max_attempt, got '" +
                                  item + "'");
    }
  }
}

// "host:port" (the last colon splits, so "[::1]:29400" keeps its brackets off).
void parse_endpoint(const std::string& flag, const std::string& text, Options& o) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw std::invalid_argument(flag + " expects HOST:PORT, got '" + text + "'");
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  o.master_addr = host;
  o.master_addr_given = true;
  o.master_port = parse_number<int>(flag + " PORT", text.substr(colon + 1), 1, 65535);
}

// A loopback address literal (127.0.0.0/8, ::1, ::ffff:127.x.y.z) or a name that is loopback by
// definition (localhost, *.localhost: RFC 6761). Other names are not resolved here: a name that leads to
// loopback on rank 0's host is the ranks' error there (src/dist/interface.cpp).
bool is_loopback(std::string host) {
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!host.empty() && host.back() == '.') host.pop_back();
  if (host == "localhost" || host.ends_with(".localhost")) return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
}

void check_consistent(const Options& o, bool node_rank_given) {
  if (o.command.empty() && !o.help) throw std::invalid_argument("no program to run; put it after the flags");
  if (o.elastic) {
    // The rendezvous numbers the nodes; every agent must find the same rendezvous address.
    if (node_rank_given) {
      throw std::invalid_argument("--node-rank is set by the rendezvous under --nnodes MIN:MAX; leave it out");
    }
    if (o.master_port == 0) {
      throw std::invalid_argument(
          "--nnodes MIN:MAX needs --master-port (or --rdzv-endpoint HOST:PORT): every node's titan-run meets "
          "the others there");
    }
    return;
  }
  if (o.node_rank >= o.nnodes) {
    throw std::invalid_argument("--node-rank must be below --nnodes (" + std::to_string(o.nnodes) + "), got " +
                                std::to_string(o.node_rank));
  }
  // Every node must agree on the rendezvous address, so it cannot be picked locally.
  if (o.nnodes > 1 && (o.master_port == 0 || !o.master_addr_given)) {
    throw std::invalid_argument(
        "--nnodes > 1 needs --master-addr (rank 0's host, reachable from every node) and "
        "--master-port: all nodes must agree on them");
  }
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  bool node_rank_given = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("-", 0) != 0) break;  // the program starts here
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      continue;
    }
    std::string value;
    bool has_value = false;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
      has_value = true;
    }
    // torchrun spells its flags both ways; accept both so its command lines port unchanged.
    for (std::size_t k = 2; k < arg.size(); ++k) {
      if (arg[k] == '_') arg[k] = '-';
    }
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--nproc-per-node") {
      o.nproc_per_node = parse_number<int>(arg, take_value(), 1, 4096);
    } else if (arg == "--nnodes") {
      parse_nnodes(arg, take_value(), o);
    } else if (arg == "--node-rank") {
      o.node_rank = parse_number<int>(arg, take_value(), 0, 100000);
      node_rank_given = true;
    } else if (arg == "--rdzv-endpoint") {
      parse_endpoint(arg, take_value(), o);
    } else if (arg == "--rdzv-conf") {
      parse_rdzv_conf(arg, take_value(), o);
    } else if (arg == "--master-addr") {
      o.master_addr = take_value();
      o.master_addr_given = true;
    } else if (arg == "--master-port") {
      o.master_port = parse_number<int>(arg, take_value(), 1, 65535);
    } else if (arg == "--grace-seconds") {
      o.grace_seconds = parse_number<double>(arg, take_value(), 0.0, 3600.0);
    } else if (arg == "--failure-grace-seconds") {
      o.failure_grace_seconds = parse_number<double>(arg, take_value(), 0.0, 3600.0);
    } else if (arg == "--max-restarts") {
      o.max_restarts = parse_number<int>(arg, take_value(), 0, 1000000);
    } else {
      throw std::invalid_argument("unknown flag '" + std::string(argv[i]) + "' (see --help)");
    }
  }
  o.command.assign(argv + i, argv + argc);
  check_consistent(o, node_rank_given);
  return o;
}

std::vector<std::string> warnings(const Options& o) {
  std::vector<std::string> out;
  if (o.nnodes > 1 && is_loopback(o.master_addr)) {
    const std::string nnodes =
        o.elastic ? std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes) : std::to_string(o.nnodes);
    out.push_back("warning: " + std::string(o.elastic ? "the rendezvous address " : "--master-addr ") + o.master_addr +
                  " is loopback: the other nodes of --nnodes " + nnodes +
                  " cannot reach it unless every node runs on this machine. Pass an address of " +
                  (o.elastic ? "the rendezvous host" : "rank 0's host") + " that the other hosts reach.");
  }
  return out;
}

std::string usage() {
  return R"(usage: titan-run --nproc-per-node N [--nnodes M --node-rank K --master-addr A --master-port P]
                 [--nnodes MIN:MAX --master-port P [--rdzv-conf ...]]
                 [--grace-seconds S] [--failure-grace-seconds F]
                 [--max-restarts R] [--] program [args...]

Starts N ranks of `program` with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, GROUP_RANK, NODE_RANK), prefixes every line they print with "[rank R] ", and
when one rank fails stops the others (SIGTERM, then SIGKILL after the grace period) and exits non-zero
naming it. SIGINT/SIGTERM are forwarded to the ranks. With --max-restarts R, a failed job is started
again (all ranks, a new rendezvous) up to R times; the ranks see TITAN_RESTART_COUNT and
TORCHELASTIC_RESTART_COUNT, and TITAN_RESTART_REASON names the failure (the hung rank, when a titan
trainer's heartbeat saw one).

  --nproc-per-node N   ranks on this node (default 1)
  --nnodes M           nodes in the job; run one titan-run per node (default 1)
  --node-rank K        this node's index, 0..M-1 (default 0)
  --master-addr A      host of rank 0 (default 127.0.0.1)
  --master-port P      rendezvous port (default: a free port; required when M > 1)
  --grace-seconds S    time between SIGTERM and SIGKILL when stopping ranks; long enough for a
                       preempted rank to write its checkpoint (default 30)
  --failure-grace-seconds F
                       the same after a rank failed: the others cannot finish their step
                       without it (default 3; at most S)
  --max-restarts R     start the whole job again up to R times when a rank fails (default 0)

Elastic (torchrun's --nnodes MIN:MAX): run one titan-run per node, all with the same --master-addr and
--master-port (or --rdzv-endpoint A:P); the one on that address hosts the rendezvous and is node 0. A
round starts with MAX nodes, or with at least MIN once no other joins for last_call_timeout. When a rank
fails or a node is lost, every node stops its ranks and the nodes left start again (if at least MIN;
counted against --max-restarts), with WORLD_SIZE and the ranks renumbered; a node joining below MAX
makes the job start again with it (its ranks get SIGTERM and --grace-seconds to save first).

  --nnodes MIN:MAX     elastic: between MIN and MAX nodes
  --rdzv-endpoint A:P  the rendezvous address (same as --master-addr A --master-port P)
  --rdzv-conf join_timeout=S,last_call_timeout=L,keep_alive_interval=K,keep_alive_max_attempt=N
                       wait S seconds for MIN nodes (default 600), then L for more (default 30); a
                       node (or the rendezvous host) that answers none of N probes K seconds apart
                       (defaults 5 and 3) is lost: cut off, or its host is down
  -h, --help           this text
)";
}

}  // namespace titan_run
