// SPDX-License-Identifier: BSD-3-Clause
// A cache of large CPU blocks under c10's CPU allocator. glibc serves a block of 32 MiB or more from a
// fresh mmap and unmaps it on free, so every large tensor of every step (the logits, their gradient, a
// widened weight) pays a page fault per 4 KiB page on first touch: an fp32 copy into a new (1024, 32768)
// tensor ran at 3.4 GB/s, into an existing one at 11 GB/s (2 threads, benchmarks/mm_dtype.cpp's CPU). A
// training step allocates the same sizes every step, so a freed block of at least `min_bytes` is kept for
// the next allocation of the same size, up to `max_cached_bytes` in all; c10's own allocator serves
// everything else. Memory tracking (core/memory_tracker.hpp) sits above the cache and installs it, so the
// cached blocks are not booked as live; the process's RSS includes them.
//
//   TITAN_CPU_BLOCK_CACHE_BYTES=0     turns it off (the default keeps up to 2 GiB)
#pragma once

#include <cstdint>

namespace titan {

struct CpuBlockCacheOptions {
  int64_t min_bytes = int64_t{1} << 20;         ///< smaller blocks go straight to c10's allocator
  int64_t max_cached_bytes = int64_t{2} << 30;  ///< free blocks kept at most; 0 = no cache
};

struct CpuBlockCacheStats {
  int64_t hits = 0;          ///< allocations served from the cache
  int64_t misses = 0;        ///< large allocations c10's allocator served
  int64_t cached_bytes = 0;  ///< bytes held in free blocks now
};

/// Puts the cache under c10's CPU allocator once per process (later calls do nothing), with `options`
/// unless TITAN_CPU_BLOCK_CACHE_BYTES gives max_cached_bytes. install_memory_tracking() calls it first.
void install_cpu_block_cache(const CpuBlockCacheOptions& options = {});
/// The counters since the cache was installed (all 0 when it is not).
CpuBlockCacheStats cpu_block_cache_stats();
/// Returns every free block to c10's allocator.
void empty_cpu_block_cache();
/// Changes max_cached_bytes of the installed cache (0 keeps nothing); frees what is cached beyond it.
void set_cpu_block_cache_limit(int64_t max_cached_bytes);

}  // namespace titan
