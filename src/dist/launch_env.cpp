// SPDX-License-Identifier: BSD-3-Clause
#include "titan/dist/launch_env.hpp"

#include "titan/core/error.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace titan::dist {
namespace {

constexpr const char* kWhere = "[titan::dist::read_launch_env]";

// The variable names a contract uses, so one validation names the right ones in its messages.
struct ContractNames {
  const char* rank;
  const char* local_rank;
  const char* world_size;
  const char* local_world_size;
};
constexpr ContractNames kTorchrunNames{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"};
constexpr ContractNames kSlurmNames{"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"};

std::optional<int64_t> parse_int(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

int64_t int_var(const std::string& name, const std::string& value) {
  const auto parsed = parse_int(value);
  TITAN_CHECK_VALUE(parsed.has_value(),
                    "{} expected {} to be an integer, got '{}'. Set {} to a whole number "
                    "or unset it.",
                    kWhere, name, value, name);
  return *parsed;
}

std::optional<int64_t> optional_int(const EnvLookup& getenv, const std::string& name) {
  const auto value = getenv(name);
  if (!value) return std::nullopt;
  return int_var(name, *value);
}

int64_t required_int(const EnvLookup& getenv, const std::string& name, const std::string& because) {
  const auto value = optional_int(getenv, name);
  TITAN_CHECK_VALUE(value.has_value(),
                    "{} expected {} to be set because {}, got it unset. Launch with "
                    "torchrun, titan-run or srun, which set the whole contract.",
                    kWhere, name, because);
  return *value;
}

int port_var(const std::string& name, int64_t port) {
  TITAN_CHECK_VALUE(port >= 1 && port <= 65535, "{} expected {} in [1, 65535], got {}. Pick a free TCP port.", kWhere,
                    name, port);
  return static_cast<int>(port);
}

void validate(const LaunchEnv& env, const ContractNames& names) {
  TITAN_CHECK_VALUE(env.world_size >= 1, "{} expected {} >= 1, got {}. It is the number of ranks.", kWhere,
                    names.world_size, env.world_size);
  TITAN_CHECK_VALUE(env.rank >= 0 && env.rank < env.world_size,
                    "{} expected 0 <= {} < {} ({}), got {}. "
                    "Every rank must be below the world size; check the launcher's process count.",
                    kWhere, names.rank, names.world_size, env.world_size, env.rank);
  TITAN_CHECK_VALUE(env.local_world_size >= 1 && env.local_world_size <= env.world_size,
                    "{} expected 1 <= {} <= {} ({}), got {}. A node cannot run more ranks than the job has.", kWhere,
                    names.local_world_size, names.world_size, env.world_size, env.local_world_size);
  TITAN_CHECK_VALUE(env.local_rank >= 0 && env.local_rank < env.local_world_size,
                    "{} expected 0 <= {} < {} ({}), got {}. Check the ranks per node the launcher was given.", kWhere,
                    names.local_rank, names.local_world_size, env.local_world_size, env.local_rank);
}

LaunchEnv read_torchrun(const EnvLookup& getenv) {
  LaunchEnv env;
  env.source = "torchrun";
  // RANK and WORLD_SIZE alone decide the job; a half-set contract is a launch mistake, not a single process.
  std::string unset;
  for (const char* name : {"RANK", "WORLD_SIZE"}) {
    if (!getenv(name)) unset += unset.empty() ? name : std::string(" and ") + name;
  }
  TITAN_CHECK_VALUE(unset.empty(),
                    "{} expected RANK and WORLD_SIZE to be set with the rest of the torchrun "
                    "contract, got {} unset. Set both (torchrun and titan-run do) or none of RANK, WORLD_SIZE, "
                    "LOCAL_RANK, LOCAL_WORLD_SIZE for a single process.",
                    kWhere, unset);
  env.rank = required_int(getenv, "RANK", "WORLD_SIZE is set");
  env.world_size = required_int(getenv, "WORLD_SIZE", "RANK is set");
  // Hand-written single-node contracts often omit the local pair: one node holds every rank then.
  env.local_world_size = optional_int(getenv, "LOCAL_WORLD_SIZE").value_or(env.world_size);
  env.local_rank = optional_int(getenv, "LOCAL_RANK").value_or(env.rank % std::max<int64_t>(env.local_world_size, 1));
  validate(env, kTorchrunNames);
  if (const auto addr = getenv("MASTER_ADDR"); addr && !addr->empty()) env.master_addr = *addr;
  const auto port = optional_int(getenv, "MASTER_PORT");
  TITAN_CHECK_VALUE(port.has_value() || env.world_size == 1,
                    "{} expected MASTER_PORT to be set because "
                    "WORLD_SIZE is {}, got it unset. Set MASTER_PORT (and MASTER_ADDR) to rank 0's rendezvous "
                    "address, or launch with torchrun or titan-run, which pick one.",
                    kWhere, env.world_size);
  if (port) env.master_port = port_var("MASTER_PORT", *port);
  return env;
}

// The tasks on this node: --ntasks-per-node when given, else this node's entry of the per-node list,
// else an even split over the nodes.
int64_t slurm_local_world_size(const EnvLookup& getenv, int64_t world_size) {
  if (const auto n = optional_int(getenv, "SLURM_NTASKS_PER_NODE")) return *n;
  const int64_t node_id = optional_int(getenv, "SLURM_NODEID").value_or(0);
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const auto value = getenv(name);
    if (!value) continue;
    const auto per_node = expand_slurm_tasks_per_node(*value);
    TITAN_CHECK_VALUE(node_id >= 0 && node_id < static_cast<int64_t>(per_node.size()),
                      "{} expected SLURM_NODEID "
                      "below the {} nodes of {}='{}', got {}. Launch the ranks with srun.",
                      kWhere, per_node.size(), name, *value, node_id);
    return per_node[node_id];
  }
  for (const char* name : {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
    const auto nodes = optional_int(getenv, name);
    if (!nodes) continue;
    TITAN_CHECK_VALUE(*nodes >= 1 && world_size % *nodes == 0,
                      "{} expected SLURM_NTASKS ({}) to split evenly over "
                      "{} ({}), got a remainder. Pass --ntasks-per-node to sbatch/srun.",
                      kWhere, world_size, name, *nodes);
    return world_size / *nodes;
  }
  return world_size;
}

std::string slurm_master_addr(const EnvLookup& getenv, int64_t world_size) {
  if (const auto addr = getenv("MASTER_ADDR"); addr && !addr->empty()) return *addr;
  // The step's node list first: rank 0 runs on its first node even when the step uses part of the job.
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const auto list = getenv(name); list && !list->empty()) return expand_slurm_nodelist(*list).front();
  }
  TITAN_CHECK_VALUE(world_size == 1,
                    "{} expected SLURM_JOB_NODELIST or MASTER_ADDR to be set because SLURM_NTASKS "
                    "is {}, got neither. Launch with srun inside an allocation, or export MASTER_ADDR.",
                    kWhere, world_size);
  return LaunchEnv{}.master_addr;
}

LaunchEnv read_slurm(const EnvLookup& getenv) {
  LaunchEnv env;
  env.source = "slurm";
  env.rank = required_int(getenv, "SLURM_PROCID", "this looks like a Slurm task");
  env.world_size = required_int(getenv, "SLURM_NTASKS", "SLURM_PROCID is set");
  env.local_rank = required_int(getenv, "SLURM_LOCALID", "SLURM_PROCID is set");
  env.local_world_size = slurm_local_world_size(getenv, env.world_size);
  validate(env, kSlurmNames);
  env.master_addr = slurm_master_addr(getenv, env.world_size);
  if (const auto port = optional_int(getenv, "MASTER_PORT")) {
    env.master_port = port_var("MASTER_PORT", *port);
  } else if (const auto job_id = optional_int(getenv, "SLURM_JOB_ID")) {
    env.master_port = slurm_default_port(*job_id);
  } else {
    TITAN_CHECK_VALUE(env.world_size == 1,
                      "{} expected MASTER_PORT or SLURM_JOB_ID to be set because SLURM_NTASKS "
                      "is {}, got neither. Export MASTER_PORT in the job script.",
                      kWhere, env.world_size);
  }
  return env;
}

// "4" or "4(x3)" -> (4, 1) or (4, 3).
std::pair<int64_t, int64_t> parse_tasks_item(const std::string& item, const std::string& whole) {
  const auto open = item.find("(x");
  const auto tasks = parse_int(item.substr(0, open));
  std::optional<int64_t> repeat = 1;
  if (open != std::string::npos) {
    const bool closed = item.size() > open + 2 && item.back() == ')';
    repeat = closed ? parse_int(item.substr(open + 2, item.size() - open - 3)) : std::nullopt;
  }
  TITAN_CHECK_VALUE(tasks && repeat && *tasks >= 1 && *repeat >= 1,
                    "[titan::dist::expand_slurm_tasks_per_node] "
                    "expected items like 4 or 4(x2) separated by commas, got '{}' in '{}'. This is Slurm's "
                    "SLURM_TASKS_PER_NODE form.",
                    item, whole);
  return {*tasks, *repeat};
}

// Splits on commas outside brackets.
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (char c : text) {
    depth += (c == '[') - (c == ']');
    if (c == ',' && depth == 0) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

void expand_host(const std::string& pattern, const std::string& whole, std::vector<std::string>& out) {
  const auto open = pattern.find('[');
  const auto close = pattern.find(']');
  if (open == std::string::npos) {
    TITAN_CHECK_VALUE(!pattern.empty() && close == std::string::npos,
                      "[titan::dist::expand_slurm_nodelist] expected "
                      "host names like node[01-04,07],gpu5, got an empty or unbalanced name in '{}'.",
                      whole);
    out.push_back(pattern);
    return;
  }
  TITAN_CHECK_VALUE(close != std::string::npos && close > open,
                    "[titan::dist::expand_slurm_nodelist] expected a "
                    "closing ']' after '[', got '{}'. Use the form node[01-04,07].",
                    whole);
  const std::string prefix = pattern.substr(0, open);
  const std::string rest = pattern.substr(close + 1);
  for (const std::string& range : split_top_level(pattern.substr(open + 1, close - open - 1))) {
    const auto dash = range.find('-');
    const std::string first_text = range.substr(0, dash);
    const auto first = parse_int(first_text);
    const auto last = dash == std::string::npos ? first : parse_int(range.substr(dash + 1));
    TITAN_CHECK_VALUE(first && last && *first >= 0 && *first <= *last,
                      "[titan::dist::expand_slurm_nodelist] "
                      "expected ranges like 01-04 or 7 inside brackets, got '{}' in '{}'.",
                      range, whole);
    for (int64_t i = *first; i <= *last; ++i) {
      // Slurm keeps the zero padding of the range's first number: node[08-10] -> node08 node09 node10.
      std::string number = std::to_string(i);
      if (number.size() < first_text.size()) number.insert(0, first_text.size() - number.size(), '0');
      expand_host(prefix + number + rest, whole, out);
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  std::vector<std::string> hosts;
  for (const std::string& pattern : split_top_level(nodelist)) expand_host(pattern, nodelist, hosts);
  return hosts;
}

std::vector<int64_t> expand_slurm_tasks_per_node(const std::string& tasks_per_node) {
  std::vector<int64_t> per_node;
  for (const std::string& item : split_top_level(tasks_per_node)) {
    const auto [tasks, repeat] = parse_tasks_item(item, tasks_per_node);
    per_node.insert(per_node.end(), repeat, tasks);
  }
  return per_node;
}

int slurm_default_port(int64_t job_id) { return 20000 + static_cast<int>((job_id % 10000 + 10000) % 10000); }

LaunchEnv read_launch_env(const EnvLookup& getenv) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    if (getenv(name)) return read_torchrun(getenv);
  }
  if (getenv("SLURM_PROCID")) return read_slurm(getenv);
  return LaunchEnv{};
}

LaunchEnv read_launch_env() {
  return read_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace titan::dist
