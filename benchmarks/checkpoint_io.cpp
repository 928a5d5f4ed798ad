// SPDX-License-Identifier: BSD-3-Clause
// Checkpoint benchmark: save and load throughput (GB/s) of titan's sharded format, sync and async,
// and the training stall an async save causes (time the training thread spends in save(), and the
// slowdown of compute steps that overlap the background write). One process, fp32 state of --gb
// GB in 64 MB tensors (half "model", half "optimizer"). Run:
//   build/bin/bench_checkpoint_io --gb 1 --dir /tmp/titan-bench-ckpt
// Loads read from the page cache when the machine has the memory (the figure is then memory and
// checksum bandwidth, not the disk's); saves fsync every file.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>

#include "titan/checkpoint/checkpointer.hpp"
#include "titan/dist/mesh.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A fixed compute step (the "training" the async writer overlaps): a few 512x512 matmuls.
double compute_step(const at::Tensor& a) {
  const auto start = Clock::now();
  at::Tensor x = a;
  for (int i = 0; i < 8; ++i) x = at::mm(x, a).tanh_();
  (void)x.sum().item<float>();
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  double gb = 1.0;
  fs::path dir = fs::temp_directory_path() / "titan-bench-ckpt";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--gb") == 0) gb = std::stod(argv[i + 1]);
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
  }
  fs::remove_all(dir);
  const titan::dist::Mesh mesh;
  const int64_t per_tensor = int64_t{16} << 20;  // floats: 64 MB
  const auto n = std::max<int64_t>(2, static_cast<int64_t>(gb * 1e9 / 4.0 / static_cast<double>(per_tensor)));
  titan::checkpoint::State state;
  for (int64_t i = 0; i < n; ++i) {
    const std::string key = fmt::format("{}.t{}", i % 2 == 0 ? "model" : "optimizer", i);
    state.tensors.push_back(titan::checkpoint::state_tensor(key, at::randn({per_tensor / 4096, 4096}), nullptr));
  }
  const double bytes = static_cast<double>(n * per_tensor * 4);
  fmt::print("state: {} tensors, {:.2f} GB fp32, folder {}\n", n, bytes / 1e9, dir.string());
  const at::Tensor a = at::randn({512, 512}).div_(30.0);
  double base = 1e9;
  for (int i = 0; i < 5; ++i) base = std::min(base, compute_step(a));

  for (const titan::AsyncMode async_mode : {titan::AsyncMode::disabled, titan::AsyncMode::async}) {
    const std::string mode(titan::choice_name(async_mode));
    titan::CheckpointConfig c;
    c.enable = true;
    c.async_mode = async_mode;
    c.keep_latest_k = 2;
    titan::checkpoint::Checkpointer ckpt(c, dir / mode, mesh);
    // Two saves: the first stages into fresh memory, the second into the first one's buffers.
    for (int64_t step = 1; step <= 2; ++step) {
      const auto start = Clock::now();
      ckpt.save(step, state, /*last=*/false);
      const double stall = seconds_since(start);
      // Compute steps while the writer runs (async); their time shows the writer's CPU cost.
      const fs::path tmp = dir / mode / "checkpoint" / fmt::format(".step-{}.tmp", step);
      int steps = 0;
      double compute = 0;
      while (async_mode == titan::AsyncMode::async && fs::exists(tmp)) {
        compute += compute_step(a);
        ++steps;
      }
      ckpt.wait();
      const double total = seconds_since(start);
      fmt::print("save {:>5} #{}: {:.2f} GB/s ({:.3f} s), training thread blocked {:.3f} s{}\n",
                 async_mode == titan::AsyncMode::disabled ? "sync" : "async", step, bytes / 1e9 / total, total, stall,
                 steps > 0 ? fmt::format(", {} overlapping compute steps at {:.2f}x the idle step time", steps,
                                         compute / steps / base)
                           : "");
    }
  }
  for (int rep = 0; rep < 2; ++rep) {
    const auto start = Clock::now();
    titan::checkpoint::load(dir / "disabled" / "checkpoint" / "step-2", state);
    const double t = seconds_since(start);
    fmt::print("load{}: {:.2f} GB/s ({:.3f} s, checksums verified)\n", rep == 0 ? " (first)" : " (again)",
               bytes / 1e9 / t, t);
  }
  fs::remove_all(dir);
  return 0;
}
