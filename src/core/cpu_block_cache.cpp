// SPDX-License-Identifier: BSD-3-Clause
#include "titan/core/cpu_block_cache.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "titan/core/error.hpp"

namespace titan {
namespace {

// Keeps c10's Allocator contract as the memory tracker does: a DataPtr's context is its data pointer, and
// raw_deleter() frees any pointer this allocator handed out, large (back to the cache) or small (c10's
// allocator's, whose DataPtr context is its data pointer too).
class BlockCache final : public c10::Allocator {
 public:
  BlockCache(c10::Allocator* base, const CpuBlockCacheOptions& options)
      : base_(base), base_raw_deleter_(base->raw_deleter()), options_(options) {
    TITAN_CHECK(base_raw_deleter_ != nullptr,
                "[titan::install_cpu_block_cache] expected c10's CPU allocator to have a raw deleter, got none. "
                "Install the cache before any other CPU allocator replaces c10's default.");
  }

  c10::DataPtr allocate(size_t n) override {
    const c10::Device device(c10::DeviceType::CPU);
    // A small block is c10's own DataPtr: its free never takes this cache's lock.
    if (static_cast<int64_t>(n) < options_.min_bytes) return base_->allocate(n);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(n);
      if (it != free_.end() && !it->second.empty()) {
        void* data = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= static_cast<int64_t>(n);
        handed_out_.emplace(data, n);
        ++hits_;
        return {data, data, &release_cached, device};
      }
      ++misses_;
    }
    c10::DataPtr fresh = allocate_or_empty(n);
    void* data = fresh.get();
    (void)fresh.release_context();
    std::lock_guard<std::mutex> lock(mutex_);
    handed_out_.emplace(data, n);
    return {data, data, &release_cached, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_cached; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

  void release(void* data) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = handed_out_.find(data);
      if (it != handed_out_.end()) {
        const size_t n = it->second;
        handed_out_.erase(it);
        if (cached_bytes_ + static_cast<int64_t>(n) <= options_.max_cached_bytes) {
          free_[n].push_back(data);
          cached_bytes_ += static_cast<int64_t>(n);
          return;
        }
      }
    }
    base_raw_deleter_(data);
  }

  void empty() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, list] : free_) blocks.insert(blocks.end(), list.begin(), list.end());
      free_.clear();
      cached_bytes_ = 0;
    }
    for (void* data : blocks) base_raw_deleter_(data);
  }

  void set_limit(int64_t max_cached_bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      options_.max_cached_bytes = max_cached_bytes;
      if (cached_bytes_ <= max_cached_bytes) return;
    }
    empty();
  }

  CpuBlockCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {.hits = hits_, .misses = misses_, .cached_bytes = cached_bytes_};
  }

  static void release_cached(void* data);

 private:
  // When memory runs out, the cached blocks are the first to go.
  c10::DataPtr allocate_or_empty(size_t n) {
    try {
      return base_->allocate(n);
    } catch (const c10::OutOfMemoryError&) {
      empty();
      return base_->allocate(n);
    }
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_raw_deleter_;
  CpuBlockCacheOptions options_;
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size -> free blocks of exactly that size
  std::unordered_map<void*, size_t> handed_out_;         // large blocks in use -> size
  int64_t cached_bytes_ = 0;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
};

BlockCache* cache = nullptr;  // process-lifetime once installed: blocks may be freed during static destruction

void BlockCache::release_cached(void* data) { cache->release(data); }

int64_t max_cached_bytes_from_env(int64_t fallback) {
  const char* text = std::getenv("TITAN_CPU_BLOCK_CACHE_BYTES");
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  TITAN_CHECK_VALUE(end != text && *end == '\0' && value >= 0,
                    "[titan::install_cpu_block_cache] expected TITAN_CPU_BLOCK_CACHE_BYTES to be a byte count >= 0, "
                    "got '{}'. Set 0 to turn the cache off, or unset it for the default (2 GiB).",
                    text);
  return value;
}

}  // namespace

void install_cpu_block_cache(const CpuBlockCacheOptions& options) {
  static std::once_flag once;
  std::call_once(once, [&] {
    CpuBlockCacheOptions chosen = options;
    chosen.max_cached_bytes = max_cached_bytes_from_env(options.max_cached_bytes);
    if (chosen.max_cached_bytes == 0) return;
    cache = new BlockCache(c10::GetCPUAllocator(), chosen);
    c10::SetCPUAllocator(cache, /*priority=*/100);
  });
}

CpuBlockCacheStats cpu_block_cache_stats() { return cache == nullptr ? CpuBlockCacheStats{} : cache->stats(); }

void empty_cpu_block_cache() {
  if (cache != nullptr) cache->empty();
}

void set_cpu_block_cache_limit(int64_t max_cached_bytes) {
  TITAN_CHECK_VALUE(max_cached_bytes >= 0,
                    "[titan::set_cpu_block_cache_limit] expected a byte count >= 0, got {}. Pass 0 to keep nothing.",
                    max_cached_bytes);
  if (cache != nullptr) cache->set_limit(max_cached_bytes);
}

}  // namespace titan
