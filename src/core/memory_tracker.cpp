// SPDX-License-Identifier: BSD-3-Clause
#include "titan/core/memory_tracker.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "titan/core/cpu_block_cache.hpp"

namespace titan {

struct MemoryTracker::Counters {
  std::array<std::atomic<int64_t>, kNumMemoryCategories> live{};
  std::array<std::atomic<int64_t>, kNumMemoryCategories> peak{};
  std::atomic<int64_t> live_total{0};
  std::atomic<int64_t> peak_total{0};

  static void raise(std::atomic<int64_t>& peak, int64_t now) {
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  void book_counters(int category, int64_t bytes) {
    const auto c = static_cast<size_t>(category);
    raise(peak[c], live[c].fetch_add(bytes) + bytes);
    raise(peak_total, live_total.fetch_add(bytes) + bytes);
  }
  void book(int category, int64_t bytes) {
    if (!recording.load(std::memory_order_relaxed)) {
      book_counters(category, bytes);
      return;
    }
    // One lock orders the counters and the timeline alike: each event's total is the running sum.
    std::lock_guard<std::mutex> lock(timeline_mutex);
    book_counters(category, bytes);
    if (!recording.load(std::memory_order_relaxed)) return;
    if (static_cast<int64_t>(timeline.events.size()) >= MemoryTracker::kMaxTimelineEvents) {
      timeline.truncated = true;
      return;
    }
    timeline.events.push_back({.time_ns = now_ns(), .bytes = bytes, .category = category, .total = live_total.load()});
  }
  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - timeline_start)
        .count();
  }
  // Starts a new timeline at the live bytes now (call with timeline_mutex held).
  void restart_timeline() {
    timeline = MemoryTimeline{};
    for (size_t c = 0; c < live.size(); ++c) timeline.base[c] = live[c].load();
    timeline_start = std::chrono::steady_clock::now();
    timeline.start_unix_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
  }

  std::atomic<bool> recording{false};
  std::mutex timeline_mutex;
  MemoryTimeline timeline;
  std::chrono::steady_clock::time_point timeline_start{};
};

namespace {

struct ThreadState {
  std::shared_ptr<MemoryTracker::Counters> counters;
  MemoryCategory category = MemoryCategory::other;
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

// An allocation booked to a rank's counters. The free is booked to the same counters whatever thread
// drops the last reference: c10's thread-local reporting hook (the profiler's) books a free to the
// freeing thread, and misses it altogether when a Gloo worker thread releases a gathered buffer.
struct Booked {
  c10::DataPtr inner;
  std::shared_ptr<MemoryTracker::Counters> counters;
  int category = 0;
  int64_t bytes = 0;
};

// The bookings, keyed by data pointer. c10's Allocator contract wants a DataPtr whose context is its
// data pointer (raw_allocate asserts it, raw_deallocate hands the deleter the data pointer): oneDNN's
// scratchpads and other raw users of the CPU allocator depend on it. So the booking lives here, not in
// the DataPtr's context. Sharded by address so rank threads rarely meet on one lock.
class Bookings {
 public:
  void insert(void* data, Booked booked) {
    Shard& s = shard(data);
    std::lock_guard<std::mutex> lock(s.mutex);
    s.map.emplace(data, std::move(booked));
  }
  std::optional<Booked> take(void* data) {
    Shard& s = shard(data);
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.map.find(data);
    if (it == s.map.end()) return std::nullopt;
    Booked booked = std::move(it->second);
    s.map.erase(it);
    return booked;
  }
  /// Runs `fn(Booked&)` on data's booking under its lock; false when data is not booked.
  template <class Fn>
  bool with(void* data, Fn&& fn) {
    Shard& s = shard(data);
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.map.find(data);
    if (it == s.map.end()) return false;
    fn(it->second);
    return true;
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<void*, Booked> map;
  };
  static constexpr size_t kShards = 64;
  Shard& shard(void* data) { return shards_[(reinterpret_cast<uintptr_t>(data) >> 6) % kShards]; }
  std::array<Shard, kShards> shards_{};
};

// Process-lifetime: a tensor may be freed during static destruction.
Bookings& bookings() {
  static auto* table = new Bookings();
  return *table;
}
c10::DeleterFnPtr base_raw_deleter = nullptr;

// The deleter of every DataPtr the tracking allocator hands out, and its raw_deleter: `data` is the
// data pointer, booked or not (allocations on untracked threads, raw_allocate's included, pass through).
void release(void* data) {
  std::optional<Booked> booked = bookings().take(data);
  if (!booked) {
    base_raw_deleter(data);
    return;
  }
  booked->counters->book(booked->category, -booked->bytes);
  // booked->inner frees through the wrapped allocator's deleter as it goes out of scope.
}

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {
    base_raw_deleter = base->raw_deleter();
    TORCH_CHECK(base_raw_deleter != nullptr,
                "[titan::install_memory_tracking] expected the CPU allocator to have a raw deleter, got none. "
                "Install memory tracking before any other CPU allocator replaces c10's default.");
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    TORCH_INTERNAL_ASSERT(data == inner.get_context(),
                          "[titan::TrackingAllocator] expected the base CPU allocator's "
                          "DataPtr context to be its data pointer");
    const c10::Device device = inner.device();
    const ThreadState& state = thread_state();
    if (state.counters && data != nullptr) {
      const int category = static_cast<int>(state.category);
      state.counters->book(category, static_cast<int64_t>(n));
      bookings().insert(data, {std::move(inner), state.counters, category, static_cast<int64_t>(n)});
    } else {
      (void)inner.release_context();  // freed by release() through the base's raw deleter
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

 private:
  c10::Allocator* base_;
};

}  // namespace

std::string_view memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::parameters:
      return "parameters";
    case MemoryCategory::gradients:
      return "gradients";
    case MemoryCategory::optimizer:
      return "optimizer";
    case MemoryCategory::activations:
      return "activations";
    case MemoryCategory::communication:
      return "communication";
    case MemoryCategory::other:
      return "other";
  }
  return "other";
}

MemoryTracker::MemoryTracker() : counters_(std::make_shared<Counters>()) {}
MemoryTracker::~MemoryTracker() = default;

int64_t MemoryTracker::live(MemoryCategory category) const {
  return counters_->live[static_cast<size_t>(category)].load();
}
int64_t MemoryTracker::peak(MemoryCategory category) const {
  return counters_->peak[static_cast<size_t>(category)].load();
}
int64_t MemoryTracker::live_total() const { return counters_->live_total.load(); }
int64_t MemoryTracker::peak_total() const { return counters_->peak_total.load(); }

void MemoryTracker::reset_peaks() {
  std::unique_lock<std::mutex> lock(counters_->timeline_mutex, std::defer_lock);
  if (counters_->recording.load()) {
    lock.lock();
    counters_->timeline.peak_resets.push_back(static_cast<int64_t>(counters_->timeline.events.size()));
  }
  for (size_t c = 0; c < counters_->live.size(); ++c) counters_->peak[c].store(counters_->live[c].load());
  counters_->peak_total.store(counters_->live_total.load());
}

void MemoryTracker::record_timeline(bool on) {
  std::lock_guard<std::mutex> lock(counters_->timeline_mutex);
  if (on && !counters_->recording.load()) counters_->restart_timeline();
  counters_->recording.store(on);
}

bool MemoryTracker::recording_timeline() const { return counters_->recording.load(); }

void MemoryTracker::mark_step(int64_t step) {
  std::lock_guard<std::mutex> lock(counters_->timeline_mutex);
  if (!counters_->recording.load()) return;
  counters_->timeline.steps.emplace_back(step, static_cast<int64_t>(counters_->timeline.events.size()));
}

MemoryTimeline MemoryTracker::take_timeline() {
  std::lock_guard<std::mutex> lock(counters_->timeline_mutex);
  MemoryTimeline taken = std::move(counters_->timeline);
  counters_->restart_timeline();
  return taken;
}

void install_memory_tracking() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The block cache goes under the tracker, so a cached block counts as freed.
    install_cpu_block_cache();
    // Lives for the process: tensors allocated through it may be freed at any time, even at exit.
    static auto* allocator = new TrackingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(allocator, /*priority=*/100);
  });
}

TrackMemory::TrackMemory(MemoryTracker& tracker) : previous_(thread_state().counters) {
  install_memory_tracking();
  thread_state().counters = tracker.counters_;
}
TrackMemory::~TrackMemory() { thread_state().counters = std::move(previous_); }

MemoryScope::MemoryScope(MemoryCategory category) : previous_(thread_state().category) {
  thread_state().category = category;
}
MemoryScope::~MemoryScope() { thread_state().category = previous_; }

void retag_memory(const at::Tensor& tensor, MemoryCategory category) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  const c10::DataPtr& ptr = tensor.storage().data_ptr();
  if (ptr.get_deleter() != &release) return;
  const int to = static_cast<int>(category);
  bookings().with(ptr.get(), [to](Booked& booked) {
    if (booked.category == to) return;
    booked.counters->book(booked.category, -booked.bytes);
    booked.counters->book(to, booked.bytes);
    booked.category = to;
  });
}

namespace {
struct BookGradient final : torch::autograd::PostAccumulateGradHook {
  void operator()(const torch::autograd::Variable& param) override {
    retag_memory(param.grad(), MemoryCategory::gradients);
  }
};
}  // namespace

void book_gradients_on_accumulation(const std::vector<at::Tensor>& params) {
  for (const auto& p : params) {
    if (!p.defined() || !p.requires_grad() || !p.is_leaf()) continue;
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(p);
    if (!hook) torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<BookGradient>());
  }
}

int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

}  // namespace titan
