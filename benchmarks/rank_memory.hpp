// SPDX-License-Identifier: BSD-3-Clause
// Per-rank CPU memory for ranks as threads: a CPU allocator that wraps the default one and books
// every allocation to the rank of the thread that made it, and its release to the same rank whatever
// thread frees it (c10's thread-local reporting hook misses frees made on a communication thread, as
// when Gloo's worker drops the last reference to a gathered buffer). Allocations on threads of no rank
// are not booked. Every allocation comes back as a plain pointer with one deleter (the booking is looked up by
// address), so ATen's raw_allocate / raw_deallocate, which need exactly that, work through it too.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace titan::bench {

inline constexpr int kMaxTrackedRanks = 16;

class RankMemory final : public c10::Allocator {
 public:
  /// Installs the tracker as the CPU allocator (once; it stays for the process's life).
  static RankMemory& install() {
    static RankMemory* tracker = [] {
      auto* t = new RankMemory(c10::GetCPUAllocator());
      c10::SetCPUAllocator(t, /*priority=*/100);
      return t;
    }();
    return *tracker;
  }
  /// Books this thread's allocations to `rank` (-1: none).
  static void set_thread_rank(int rank) { thread_rank() = rank; }
  int64_t live(int rank) const { return slots_[rank].live.load(); }
  int64_t peak(int rank) const { return slots_[rank].peak.load(); }
  /// Restarts the peak of `rank` at its current live bytes.
  void reset_peak(int rank) { slots_[rank].peak.store(slots_[rank].live.load()); }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;
    const c10::Device device = inner.device();
    const int rank = thread_rank();
    const bool tracked = rank >= 0 && rank < kMaxTrackedRanks;
    if (tracked) book(rank, static_cast<int64_t>(n));
    {
      const std::lock_guard lock(mutex_);
      booked_.emplace(data, Booked{std::move(inner), tracked ? rank : -1, static_cast<int64_t>(n)});
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

 private:
  struct Slot {
    std::atomic<int64_t> live{0}, peak{0};
  };
  struct Booked {
    c10::DataPtr inner;  // the wrapped allocator's allocation (its deleter frees it)
    int rank;            // -1: not booked
    int64_t bytes;
  };

  explicit RankMemory(c10::Allocator* base) : base_(base) {}
  static int& thread_rank() {
    thread_local int rank = -1;
    return rank;
  }
  void book(int rank, int64_t bytes) {
    const int64_t now = slots_[rank].live.fetch_add(bytes) + bytes;
    int64_t peak = slots_[rank].peak.load();
    while (now > peak && !slots_[rank].peak.compare_exchange_weak(peak, now)) {
    }
  }
  static void release(void* data) {
    RankMemory& self = install();
    Booked b;
    {
      const std::lock_guard lock(self.mutex_);
      auto it = self.booked_.find(data);
      b = std::move(it->second);
      self.booked_.erase(it);
    }
    if (b.rank >= 0) self.book(b.rank, -b.bytes);
  }  // b.inner frees through the wrapped allocator's deleter

  c10::Allocator* base_;
  std::mutex mutex_;
  std::unordered_map<void*, Booked> booked_;
  std::array<Slot, kMaxTrackedRanks> slots_{};
};

}  // namespace titan::bench
