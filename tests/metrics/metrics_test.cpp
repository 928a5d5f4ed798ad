// SPDX-License-Identifier: BSD-3-Clause
// Metrics: the GPU peak table, the declared CPU peak, process memory, and the logged record's
// arithmetic (tflops = flops_per_token * tps, mfu = that / peak) in the console line and the JSONL.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <thread>

#include "test_util.hpp"
#include "titan/core/cpu_info.hpp"
#include "titan/metrics/metrics.hpp"

TEST_CASE("peak FLOPs: torchtitan's GPU table and the CPU peak", "[metrics]") {
  CHECK(titan::gpu_peak_flops("NVIDIA H200").value() == 989e12);
  CHECK(titan::gpu_peak_flops("NVIDIA H100 PCIe").value() == 756e12);
  CHECK(titan::gpu_peak_flops("NVIDIA H100 80GB HBM3").value() == 989e12);
  CHECK(titan::gpu_peak_flops("NVIDIA A100-SXM4-80GB").value() == 312e12);
  CHECK_FALSE(titan::gpu_peak_flops("Some GPU").has_value());
  CHECK(titan::peak_flops(at::kCPU, 2, 5e11).flops == 5e11);
  const auto one = titan::peak_flops(at::kCPU, 1);
  const auto two = titan::peak_flops(at::kCPU, 2);
  CHECK(one.flops > 1e9);
  CHECK(two.flops == Approx(2 * one.flops));
  CHECK_THAT(two.description, Catch::Contains("2 threads"));
}

TEST_CASE("CPU info: extensions from the flag list and the peak of each GEMM dtype", "[metrics]") {
  const std::string head = "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse fma avx2";
  const auto parse = [&](const std::string& more) { return titan::parse_cpu_info(head + more + "\n", 2e9); };
  const titan::CpuInfo avx2 = parse("");
  CHECK(avx2.model == "Test CPU");
  CHECK((avx2.avx2 && !avx2.avx512 && !avx2.native_bf16()));
  CHECK(avx2.peak_flops(2, false) == 2 * 32 * 2e9);
  CHECK(avx2.peak_flops(2, true) == avx2.peak_flops(2, false));  // bf16 widened to fp32
  const titan::CpuInfo bf16 = parse(" avx512f avx512_bf16");
  CHECK(bf16.peak_flops(1, false) == 64 * 2e9);
  CHECK(bf16.peak_flops(1, true) == 128 * 2e9);
  const titan::CpuInfo amx = parse(" avx512f avx512_bf16 amx_bf16 amx_tile");
  CHECK(amx.peak_flops(1, true) == 1024 * 2e9);
  CHECK_FALSE(parse(" avx512f amx_tile").amx_bf16);
  CHECK_FALSE(parse(" avx512fx").avx512);  // whole flags only
  CHECK_THAT(amx.describe(), Catch::Contains("AVX512-BF16, AMX-BF16") && Catch::Contains("2.00 GHz"));
  CHECK_THAT(avx2.describe(), Catch::Contains("no AVX-512"));
  // This machine's: the trainer's bf16 peak is at least its fp32 one.
  CHECK(titan::peak_flops(at::kCPU, 2, 0, true).flops >= titan::peak_flops(at::kCPU, 2).flops);
}

TEST_CASE("CPU memory is the process's resident set", "[metrics]") {
  const auto before = titan::memory_stats(at::kCPU);
  CHECK(before.capacity > 0);
  CHECK(before.max_active > 0);
  at::Tensor big = at::ones({64, 1024, 1024});  // 256 MiB, touched
  const auto after = titan::memory_stats(at::kCPU);
  CHECK(after.max_active >= before.max_active + 200 * 1024 * 1024);
  CHECK(big.sum().item<double>() == 64.0 * 1024 * 1024);
}

TEST_CASE("logged record: tps, tflops and mfu are consistent and written to JSONL", "[metrics]") {
  titan::test::TempDir dir;
  const auto path = dir.path / "metrics.jsonl";
  titan::StepMetrics m;
  {
    titan::MetricsProcessor metrics(
        {.flops_per_token = 1'000'000, .peak_flops = 1e10, .jsonl_path = path, .color = false});
    metrics.add_step(4096, 0.01);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    m = metrics.log(7, 2.5, 0.75, 3e-4);
    CHECK_THAT(metrics.format_line(m), Catch::Contains("step:   7") && Catch::Contains("loss:  2.50000") &&
                                           Catch::Contains("grad_norm:  0.7500") && !Catch::Contains("\033["));
  }
  CHECK(m.tps > 0);
  CHECK(m.tps < 4096 / 0.1 * 1.01);  // at least 100 ms elapsed
  CHECK(m.tflops == Approx(1e6 * m.tps / 1e12));
  CHECK(m.mfu == Approx(100.0 * 1e6 * m.tps / 1e10));
  CHECK(m.tokens_seen == 4096);
  CHECK(m.data_pct > 0);
  CHECK(m.data_pct < 100);
  const auto record = nlohmann::json::parse(titan::test::read_file(path));
  CHECK(record["step"] == 7);
  CHECK(record["loss_metrics/global_avg_loss"] == 2.5);
  CHECK(record["lr"] == 3e-4);
  CHECK(record["throughput(tps)"].get<double>() == Approx(m.tps));
  CHECK(record["n_tokens_seen"] == 4096);
}
