// SPDX-License-Identifier: BSD-3-Clause
// The large-block cache under c10's CPU allocator: a freed large block serves the next allocation of its
// size, small ones pass through, the limit holds, raw_allocate/raw_deallocate keep c10's contract, and
// memory tracking above it books a cached block as freed.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include "test_util.hpp"
#include "titan/core/cpu_block_cache.hpp"
#include "titan/core/memory_tracker.hpp"

namespace titan::test {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

/// A fresh fp32 tensor of `bytes` (a multiple of 4) through c10's CPU allocator.
at::Tensor block_of(int64_t bytes) { return at::empty({bytes / 4}, at::kFloat); }

/// Installs the cache with the defaults, empties it and restores the default limit when done.
struct FreshCache {
  FreshCache() {
    install_memory_tracking();  // installs the cache under the tracker, as a training run does
    set_cpu_block_cache_limit(CpuBlockCacheOptions{}.max_cached_bytes);
    empty_cpu_block_cache();
  }
  ~FreshCache() {
    set_cpu_block_cache_limit(CpuBlockCacheOptions{}.max_cached_bytes);
    empty_cpu_block_cache();
  }
};

}  // namespace

TEST_CASE("CPU block cache: a freed large block serves the next allocation of its size, small ones pass",
          "[core][memory]") {
  const FreshCache fresh;
  const CpuBlockCacheStats before = cpu_block_cache_stats();
  void* first = nullptr;
  {
    const at::Tensor t = block_of(3 * kMiB);
    first = t.data_ptr();
  }
  CHECK(cpu_block_cache_stats().cached_bytes == 3 * kMiB);
  {
    const at::Tensor again = block_of(3 * kMiB);
    CHECK(again.data_ptr() == first);  // the same block, no new mapping
    CHECK(cpu_block_cache_stats().cached_bytes == 0);
    const at::Tensor other = block_of(3 * kMiB + 4096);  // another size: not that block
    CHECK(other.data_ptr() != first);
  }
  const CpuBlockCacheStats after = cpu_block_cache_stats();
  CHECK(after.hits == before.hits + 1);
  CHECK(after.misses == before.misses + 2);
  CHECK(after.cached_bytes == 6 * kMiB + 4096);
  {
    const at::Tensor small = block_of(64 * 1024);  // below min_bytes
  }
  CHECK(cpu_block_cache_stats().misses == after.misses);
  CHECK(cpu_block_cache_stats().cached_bytes == after.cached_bytes);
  empty_cpu_block_cache();
  CHECK(cpu_block_cache_stats().cached_bytes == 0);
}

TEST_CASE("CPU block cache: the limit bounds the cached bytes, and lowering it frees the excess", "[core][memory]") {
  const FreshCache fresh;
  set_cpu_block_cache_limit(5 * kMiB);
  {
    std::vector<at::Tensor> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(block_of(2 * kMiB));
  }
  CHECK(cpu_block_cache_stats().cached_bytes == 4 * kMiB);  // two of the four fit under 5 MiB
  set_cpu_block_cache_limit(kMiB);
  CHECK(cpu_block_cache_stats().cached_bytes == 0);
  CHECK_THAT(error_of([] { set_cpu_block_cache_limit(-1); }),
             Catch::Contains("set_cpu_block_cache_limit") && Catch::Contains("-1"));
}

TEST_CASE("CPU block cache: raw_allocate and raw_deleter keep c10's contract, large and small, under tracking",
          "[core][memory]") {
  const FreshCache fresh;
  MemoryTracker tracker;
  const TrackMemory track(tracker);
  c10::Allocator* allocator = c10::GetCPUAllocator();
  for (const int64_t bytes : {4 * kMiB, int64_t{4096}}) {
    INFO(bytes << " bytes");
    void* raw = allocator->raw_allocate(static_cast<size_t>(bytes));  // asserts data == context inside c10
    REQUIRE(raw != nullptr);
    static_cast<char*>(raw)[bytes - 1] = 1;
    CHECK(tracker.live_total() >= bytes);
    allocator->raw_deallocate(raw);
    CHECK(tracker.live_total() == 0);  // booked as freed, cached or not
  }
  CHECK(cpu_block_cache_stats().cached_bytes == 4 * kMiB);
  // The cached block serves a tensor, booked again while it lives.
  {
    const at::Tensor t = block_of(4 * kMiB);
    CHECK(tracker.live_total() == 4 * kMiB);
    CHECK(cpu_block_cache_stats().cached_bytes == 0);
  }
  CHECK(tracker.live_total() == 0);
}

}  // namespace titan::test
