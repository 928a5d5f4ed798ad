// SPDX-License-Identifier: BSD-3-Clause
// The launch contract: who this process is in the job and where the rendezvous store lives. titan
// reads it from the environment that torchrun, titan-run or srun set, so every launcher works
// unchanged. See docs/launch.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace titan::dist {

/// This process's place in the job, as the launcher described it.
struct LaunchEnv {
  int64_t rank = 0;                       ///< global rank
  int64_t local_rank = 0;                 ///< rank within the node
  int64_t world_size = 1;                 ///< number of ranks
  int64_t local_world_size = 1;           ///< ranks on this node
  std::string master_addr = "127.0.0.1";  ///< rendezvous host
  int master_port = 0;                    ///< rendezvous TCP port (0 when single process)
  std::string source = "none";            ///< "torchrun", "slurm", or "none" (single process)
};

/// Looks up one environment variable; std::nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// Reads the launch contract from the process environment (see the overload).
LaunchEnv read_launch_env();

/// Reads the torchrun contract (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT) when any of its rank variables is set; else Slurm's when SLURM_PROCID is set
/// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, tasks per node, the first host of SLURM_JOB_NODELIST
/// unless MASTER_ADDR is set, MASTER_PORT or a port derived from SLURM_JOB_ID); else a single
/// process. Throws c10::ValueError naming the variable on a partial or inconsistent contract.
LaunchEnv read_launch_env(const EnvLookup& getenv);

/// Expands Slurm's compressed host list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
/// Zero padding is kept; several bracket groups in one name expand as a product.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

/// Expands Slurm's tasks-per-node form "4(x2),3" -> {4, 4, 3} (one entry per node).
std::vector<int64_t> expand_slurm_tasks_per_node(const std::string& tasks_per_node);

/// The rendezvous port derived from a Slurm job id when MASTER_PORT is unset: 20000 + id % 10000,
/// the same on every node of the job and different for neighbouring jobs.
int slurm_default_port(int64_t job_id);

}  // namespace titan::dist
