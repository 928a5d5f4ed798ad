// SPDX-License-Identifier: BSD-3-Clause
// What the launcher tests share: where titan-run and the env probe are, and parsing the probe's lines.
#pragma once

#include "dist/subprocess.hpp"
#include "test_util.hpp"

#include <map>
#include <regex>
#include <string>
#include <vector>

namespace titan::test {

inline std::string titan_run_path() { return (binary_dir() / "bin" / "titan-run").string(); }
inline std::string env_probe_path() { return (binary_dir() / "bin" / "titan_env_probe").string(); }

/// `titan-run --nproc-per-node 2 train_llama3`: the CPU debug job on 2 FSDP ranks, `steps` steps of 2 x 64
/// tokens per rank, writing to `dump`; `extra` flags go to the trainer.
inline std::vector<std::string> fsdp2_debug_job(const std::string& dump, int steps,
                                                const std::vector<std::string>& extra) {
  std::vector<std::string> args = {titan_run_path(),
                                   "--nproc-per-node",
                                   "2",
                                   "--",
                                   (binary_dir() / "bin" / "train_llama3").string(),
                                   "--job.config_file",
                                   (source_dir() / "configs" / "llama3_debugmodel_cpu.toml").string(),
                                   "--training.steps",
                                   std::to_string(steps),
                                   "--training.seq_len",
                                   "64",
                                   "--training.local_batch_size",
                                   "2",
                                   "--parallelism.data_parallel_shard_degree",
                                   "2",
                                   "--job.dump_folder",
                                   dump};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

/// a followed by b.
inline std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// `program` (a program of bin/) and its flags for the deterministic CPU debug job: the debug flavor on
/// tinyshakespeare (the tests' BPE tokenizer), one thread per rank, `steps` steps of `local_batch` sequences of 32
/// tokens per rank, every step logged to `dump`. Later flags override these.
inline std::vector<std::string> debug_job(const std::string& program, const fs::path& dump, int64_t steps,
                                          int64_t local_batch) {
  return {(binary_dir() / "bin" / program).string(),
          "--model.flavor",
          "debugmodel",
          "--model.hf_assets_path",
          test_tokenizer().string(),
          "--training.dataset",
          "tinyshakespeare",
          "--training.dataset_path",
          tinyshakespeare().string(),
          "--training.seq_len",
          "32",
          "--training.local_batch_size",
          std::to_string(local_batch),
          "--training.steps",
          std::to_string(steps),
          "--training.num_threads",
          "1",
          "--debug.seed",
          "7",
          "--debug.deterministic",
          "true",
          "--lr_scheduler.warmup_steps",
          "2",
          "--job.dump_folder",
          dump.string(),
          "--metrics.log_freq",
          "1"};
}

/// train_llama3 with the debug job's flags.
inline std::vector<std::string> debug_trainer(const fs::path& dump, int64_t steps, int64_t local_batch) {
  return debug_job("train_llama3", dump, steps, local_batch);
}

/// The fault-tolerance tests' job: debug_trainer with 2 FSDP ranks of 2 sequences each.
inline std::vector<std::string> tiny_fsdp2_trainer(const fs::path& dump, int64_t steps) {
  return concat(debug_trainer(dump, steps, 2), {"--parallelism.data_parallel_shard_degree", "2"});
}

/// One "probe ..." line: its key=value fields, and the "[rank R] " prefix the launcher added (-1: none).
struct ProbeLine {
  long prefix_rank = -1;
  std::map<std::string, std::string> fields;
  long field(const std::string& key) const { return std::stol(fields.at(key)); }
};

/// The probe lines in `output`, keyed by the rank the probe read.
inline std::map<long, ProbeLine> probe_lines(const std::string& output) {
  static const std::regex line_re(R"((?:\[rank (\d+)\] )?probe (.*))");
  static const std::regex field_re(R"((\w+)=(\S*))");
  std::map<long, ProbeLine> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, line_re)) continue;
    ProbeLine probe;
    if (m[1].matched) probe.prefix_rank = std::stol(m[1].str());
    const std::string fields = m[2].str();
    for (std::sregex_iterator it(fields.begin(), fields.end(), field_re), end; it != end; ++it) {
      probe.fields[(*it)[1].str()] = (*it)[2].str();
    }
    lines[probe.field("rank")] = probe;
  }
  return lines;
}

/// True once `n` probes have printed their line.
inline auto has_probes(std::size_t n) {
  return [n](const std::string& output) { return probe_lines(output).size() >= n; };
}

/// Waits for `run` to end (a hang fails the test) and checks its exit code (-signal when killed).
inline void require_exit(Subprocess& run, int expected, double seconds) {
  const auto status = run.wait(seconds);
  INFO(run.output());
  REQUIRE(status);
  CHECK(exit_code(*status) == expected);
}

/// What one node's probes must have read: ranks first_rank, first_rank + 1, ... on one port.
struct NodeContract {
  long first_rank = 0;           ///< global rank of the node's local rank 0
  long local_world_size = 1;     ///< probes expected on the node
  long world_size = 1;           ///< ranks in the job
  std::string group_rank = "0";  ///< GROUP_RANK as printed
  std::string master_addr = "";  ///< expected MASTER_ADDR; empty: not checked
  long master_port = 0;          ///< expected MASTER_PORT; 0: any, the same on every rank
  bool prefixed = true;          ///< lines carry titan-run's "[rank R] " prefix
};

inline void check_node(const std::map<long, ProbeLine>& lines, const NodeContract& want) {
  REQUIRE(lines.size() == static_cast<std::size_t>(want.local_world_size));
  const long port = want.master_port != 0 ? want.master_port : lines.begin()->second.field("master_port");
  CHECK(port > 0);
  for (long local = 0; local < want.local_world_size; ++local) {
    const long rank = want.first_rank + local;
    INFO("rank " << rank);
    REQUIRE(lines.count(rank) == 1);
    const ProbeLine& line = lines.at(rank);
    CHECK(line.prefix_rank == (want.prefixed ? rank : -1));
    CHECK(line.field("local_rank") == local);
    CHECK(line.field("world_size") == want.world_size);
    CHECK(line.field("local_world_size") == want.local_world_size);
    CHECK(line.field("master_port") == port);
    if (!want.master_addr.empty()) CHECK(line.fields.at("master_addr") == want.master_addr);
    CHECK(line.fields.at("source") == "torchrun");
    CHECK(line.fields.at("group_rank") == want.group_rank);
  }
}

/// False once no process `pid` exists (reaped, not even a zombie).
inline bool process_exists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

/// False once `pid` has exited; a zombie waiting for init to reap it counts as exited.
inline bool process_running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');  // the command name may contain spaces and parentheses
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

}  // namespace titan::test
