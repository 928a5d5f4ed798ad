// SPDX-License-Identifier: BSD-3-Clause
// The tracking CPU allocator keeps c10's Allocator contract: a DataPtr's context is its data pointer, so
// raw_allocate / raw_deleter (oneDNN's scratchpads, some fp8 and quantized kernels) work under it on any
// CPU. The contract is called directly here, so the test fails on every CPU, not only on one whose ATen
// takes a raw-allocating path; the bf16 and float8 GEMMs then run through whatever path this CPU takes.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <thread>

#include "test_util.hpp"
#include "titan/core/memory_tracker.hpp"

namespace titan::test {

TEST_CASE("memory tracker: raw_allocate and raw_deleter keep c10's contract and book the bytes", "[memory][core]") {
  MemoryTracker tracker;
  TrackMemory track(tracker);
  c10::Allocator* allocator = c10::GetCPUAllocator();

  SECTION("a DataPtr's context is its data pointer") {
    const c10::DataPtr ptr = allocator->allocate(4096);
    CHECK(ptr.get() != nullptr);
    CHECK(ptr.get() == ptr.get_context());
  }
  SECTION("raw_allocate books to the thread's category, raw_deallocate books the free") {
    const int64_t before = tracker.live(MemoryCategory::activations);
    void* raw = nullptr;
    {
      MemoryScope scope(MemoryCategory::activations);
      raw = allocator->raw_allocate(1 << 20);  // asserts data == context inside c10
    }
    REQUIRE(raw != nullptr);
    CHECK(tracker.live(MemoryCategory::activations) == before + (1 << 20));
    REQUIRE(allocator->raw_deleter() != nullptr);
    allocator->raw_deallocate(raw);
    CHECK(tracker.live(MemoryCategory::activations) == before);
  }
  SECTION("an untracked thread's raw allocation passes through and frees cleanly") {
    const int64_t before = tracker.live_total();
    std::thread untracked([&] {
      void* raw = allocator->raw_allocate(12345);
      CHECK(raw != nullptr);
      allocator->raw_deallocate(raw);
    });
    untracked.join();
    CHECK(tracker.live_total() == before);
  }
  SECTION("a tensor freed on another thread is booked to the tracker it was allocated on") {
    const int64_t before = tracker.live(MemoryCategory::parameters);
    at::Tensor t;
    {
      MemoryScope scope(MemoryCategory::parameters);
      t = at::empty({256, 256}, at::kFloat);
    }
    CHECK(tracker.live(MemoryCategory::parameters) == before + 256 * 256 * 4);
    retag_memory(t, MemoryCategory::gradients);
    CHECK(tracker.live(MemoryCategory::parameters) == before);
    std::thread other([t = std::move(t)]() mutable { t.reset(); });
    other.join();
    CHECK(tracker.live(MemoryCategory::gradients) == 0);
  }
}

TEST_CASE("memory tracker: bf16 and float8 GEMMs run under tracking (oneDNN's path where the CPU has bf16)",
          "[memory][core]") {
  MemoryTracker tracker;
  TrackMemory track(tracker);
  MemoryScope scope(MemoryCategory::activations);
  at::manual_seed(0);
  const at::Tensor a = at::randn({192, 320});  // (M, K)
  const at::Tensor b = at::randn({320, 256});  // (K, N)
  const at::Tensor want = at::mm(a.to(at::kDouble), b.to(at::kDouble));
  // bf16 inputs carry a relative error of 2^-9 each; over K = 320 random terms the sum's error stays well
  // under 3% of the typical |output| of sqrt(K).
  const at::Tensor got = at::mm(a.to(at::kBFloat16), b.to(at::kBFloat16)).to(at::kDouble);  // (M, N)
  CHECK((got - want).abs().max().item<double>() < 0.03 * std::sqrt(320.0));
  // Linear's bf16 path (addmm with a bias) is the one autocast takes.
  const at::Tensor bias = at::randn({256});
  const at::Tensor lin = at::linear(a.to(at::kBFloat16), b.t().to(at::kBFloat16), bias.to(at::kBFloat16));
  CHECK((lin.to(at::kDouble) - want - bias.to(at::kDouble)).abs().max().item<double>() < 0.03 * std::sqrt(320.0));
  // float8 tensorwise GEMM through ATen (oneDNN's fp8 matmul on CPUs that have it, the emulation elsewhere).
  const at::Tensor a8 = a.to(at::kFloat8_e4m3fn);
  const at::Tensor b8 = b.t().contiguous().to(at::kFloat8_e4m3fn).t();  // column-major, as _scaled_mm wants
  const at::Tensor one = at::ones({}, at::kFloat);
  const at::Tensor f8 = at::_scaled_mm(a8, b8, one, one, std::nullopt, std::nullopt, at::kFloat, false);
  const at::Tensor f8_want = at::mm(a8.to(at::kFloat), b8.to(at::kFloat));
  CHECK(at::allclose(f8, f8_want, 1e-5, 1e-4));
  CHECK(tracker.peak(MemoryCategory::activations) > 0);
}

}  // namespace titan::test
