// SPDX-License-Identifier: BSD-3-Clause
// Profiler traces (Kineto, or titan's thread-local recorder when another rank thread of this process
// holds Kineto) and memory snapshots (CUDA allocator pickle, CPU timeline JSON).
#include "titan/metrics/profiler.hpp"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/profile_scope.hpp"
#include "titan/metrics/detail/cuda_memory_snapshot.hpp"

namespace titan {

ProfilerPhase profiler_phase(int64_t step, int64_t freq, int64_t warmup, int64_t active) {
  TITAN_CHECK_VALUE(freq >= 1 && warmup >= 0 && active >= 1 && freq >= warmup + active,
                    "[titan::profiler_phase] expected profile_freq >= profiler_warmup + profiler_active with "
                    "profile_freq, profiler_active >= 1, got profile_freq {}, profiler_warmup {}, profiler_active {}. "
                    "Raise profiling.profile_freq or lower the others.",
                    freq, warmup, active);
  const int64_t in_cycle = (step - 1) % freq;
  const int64_t wait = freq - warmup - active;
  if (step < 1 || in_cycle < wait) return ProfilerPhase::idle;
  return in_cycle < wait + warmup ? ProfilerPhase::warmup : ProfilerPhase::active;
}

namespace {

namespace kineto = torch::autograd::profiler;
namespace prof = torch::profiler::impl;

// --- titan's thread-local recorder ---------------------------------------------------------------------

struct RecordedOp {
  std::string name;
  bool user_scope = false;
  int64_t start_ns = 0;  // steady clock
  int64_t end_ns = 0;
  uint64_t tid = 0;
};

struct RecorderState {
  std::mutex mutex;
  std::vector<RecordedOp> ops;
};

// The rank thread's recorder. Ops on intra-op pool threads (which inherit the thread-local callback)
// find none here and are skipped: the recorder traces the rank's own thread.
thread_local std::shared_ptr<RecorderState> tl_recorder;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct StartTime final : at::ObserverContext {
  int64_t ns = 0;
};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction&) {
  if (!tl_recorder) return nullptr;
  auto start = std::make_unique<StartTime>();
  start->ns = steady_ns();
  return start;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (!tl_recorder || context == nullptr) return;
  RecordedOp op{.name = fn.name(),
                .user_scope = fn.scope() == at::RecordScope::USER_SCOPE,
                .start_ns = static_cast<StartTime*>(context)->ns,
                .end_ns = steady_ns(),
                .tid = static_cast<uint64_t>(gettid())};
  std::lock_guard<std::mutex> lock(tl_recorder->mutex);
  tl_recorder->ops.push_back(std::move(op));
}

// Chrome trace JSON with Kineto's fields for CPU ops: ph X, cat cpu_op / user_annotation, ts and dur in us.
std::string chrome_trace_json(const std::vector<RecordedOp>& ops, int64_t rank, int64_t origin_steady_ns,
                              int64_t origin_unix_us) {
  using json = nlohmann::json;
  json events = json::array();
  const int pid = static_cast<int>(getpid());
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{"name", fmt::format("rank {} (titan thread-local recorder)", rank)}}}});
  for (const auto& op : ops) {
    const double ts = static_cast<double>(origin_unix_us) + static_cast<double>(op.start_ns - origin_steady_ns) / 1e3;
    events.push_back({{"ph", "X"},
                      {"cat", op.user_scope ? "user_annotation" : "cpu_op"},
                      {"name", op.name},
                      {"pid", pid},
                      {"tid", op.tid},
                      {"ts", ts},
                      {"dur", static_cast<double>(op.end_ns - op.start_ns) / 1e3},
                      {"args", {{"rank", rank}}}});
  }
  json trace = {{"schemaVersion", 1},
                {"displayTimeUnit", "ms"},
                {"traceName", fmt::format("titan rank {}", rank)},
                {"traceEvents", std::move(events)}};
  return trace.dump();
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    TITAN_CHECK(out.good(), "[titan::profiler] expected to write {}, got a write error. Check the disk and the folder.",
                tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

// Kineto is one session per process: the Profiler holding it.
std::atomic<const void*> kineto_holder{nullptr};

}  // namespace

struct Profiler::Impl {
  Options options;
  ProfilerBackend backend = ProfilerBackend::automatic;  // of the capture in progress or the last one
  bool prepared = false;                                 // warm-up (Kineto prepared) or recording
  bool recording = false;
  // The thread-local recorder's capture.
  std::shared_ptr<RecorderState> recorder;
  at::CallbackHandle handle = 0;
  int64_t origin_steady_ns = 0;
  int64_t origin_unix_us = 0;
  std::unique_ptr<ProfileScope> step_scope;  // "ProfilerStep#<n>", as torch.profiler marks steps

  bool holds_kineto() const { return kineto_holder.load() == this; }

  void prepare() {
    if (prepared) return;
    backend = options.backend;
    if (backend != ProfilerBackend::thread_local_recorder) {
      const void* expected = nullptr;
      if (kineto_holder.compare_exchange_strong(expected, this)) {
        backend = ProfilerBackend::kineto;
      } else {
        TITAN_CHECK(backend == ProfilerBackend::automatic,
                    "[titan::Profiler] expected Kineto to be free, got another profiler of this process holding it "
                    "(Kineto is one session per process). Use ProfilerBackend::automatic or thread_local_recorder "
                    "for ranks as threads.");
        backend = ProfilerBackend::thread_local_recorder;
      }
    }
    if (backend == ProfilerBackend::kineto) {
      try {
        kineto::prepareProfiler(config(), activities());
      } catch (...) {
        kineto_holder.store(nullptr);
        throw;
      }
    }
    prepared = true;
  }

  prof::ProfilerConfig config() const {
    return prof::ProfilerConfig(prof::ProfilerState::KINETO, /*report_input_shapes=*/true, /*profile_memory=*/false,
                                /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
  }
  std::set<prof::ActivityType> activities() const {
    std::set<prof::ActivityType> set{prof::ActivityType::CPU};
    if (options.cuda) set.insert(prof::ActivityType::CUDA);
    return set;
  }

  void start() {
    prepare();
    if (backend == ProfilerBackend::kineto) {
      kineto::enableProfiler(config(), activities());
    } else {
      recorder = std::make_shared<RecorderState>();
      tl_recorder = recorder;
      origin_steady_ns = steady_ns();
      origin_unix_us =
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      handle = at::addThreadLocalCallback(
          at::RecordFunctionCallback(&on_op_start, &on_op_end)
              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
    }
    recording = true;
  }

  // Ends the capture; writes it to `path` when given.
  void stop(const std::optional<std::filesystem::path>& path) {
    step_scope.reset();
    if (backend == ProfilerBackend::kineto) {
      if (!recording) kineto::enableProfiler(config(), activities());  // a prepared trace ends through start/stop
      std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
      kineto_holder.store(nullptr);
      if (path) {
        std::filesystem::create_directories(path->parent_path());
        result->save(path->string());
      }
    } else if (recording) {
      at::removeCallback(handle);
      tl_recorder.reset();
      std::vector<RecordedOp> ops;
      {
        std::lock_guard<std::mutex> lock(recorder->mutex);
        ops = std::move(recorder->ops);
      }
      recorder.reset();
      if (path) write_text(*path, chrome_trace_json(ops, options.rank, origin_steady_ns, origin_unix_us));
    }
    prepared = false;
    recording = false;
  }

  std::filesystem::path trace_path(int64_t step) const {
    return options.folder / fmt::format("iteration_{}", step) / fmt::format("rank{}_trace.json", options.rank);
  }

  std::filesystem::path save(int64_t step) {
    const auto begin = std::chrono::steady_clock::now();
    const std::filesystem::path path = trace_path(step);
    stop(path);
    log::info("Profiler trace of step {} in {} ({:.2f} s to write)", step, path.string(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
    return path;
  }
};

Profiler::Profiler(Options options) : impl_(std::make_unique<Impl>()) {
  (void)profiler_phase(1, options.freq, options.warmup, options.active);  // checks the schedule
  impl_->options = std::move(options);
  log::info("Profiling active: traces every {} steps in {}", impl_->options.freq, impl_->options.folder.string());
}

Profiler::~Profiler() {
  if (!impl_->prepared) return;
  try {
    impl_->stop(std::nullopt);
  } catch (const std::exception& e) {
    log::warn("Profiler: stopping the capture failed: {}", error_message(e));
  }
}

void Profiler::begin_step(int64_t step) {
  const ProfilerPhase phase = profiler_phase(step, impl_->options.freq, impl_->options.warmup, impl_->options.active);
  if (phase == ProfilerPhase::warmup) impl_->prepare();
  if (phase == ProfilerPhase::active && !impl_->recording) impl_->start();
  if (impl_->recording) impl_->step_scope = std::make_unique<ProfileScope>("ProfilerStep#", std::to_string(step));
}

std::optional<std::filesystem::path> Profiler::end_step(int64_t step) {
  impl_->step_scope.reset();
  if (!impl_->recording || step % impl_->options.freq != 0) return std::nullopt;
  return impl_->save(step);
}

std::optional<std::filesystem::path> Profiler::finish(int64_t last_step) {
  if (impl_->recording) return impl_->save(last_step);
  if (impl_->prepared) impl_->stop(std::nullopt);
  return std::nullopt;
}

ProfilerBackend Profiler::backend() const { return impl_->backend; }

// --- memory snapshots ------------------------------------------------------------------------------------

namespace {
constexpr size_t kCudaHistoryEntries = 100000;  // torchtitan's MEMORY_SNAPSHOT_MAX_ENTRIES
}

MemorySnapshotter::MemorySnapshotter(Options options) : options_(std::move(options)) {
  TITAN_CHECK_VALUE(options_.freq >= 1, "[titan::MemorySnapshotter] expected profile_freq >= 1, got {}.",
                    options_.freq);
  if (options_.device.is_cuda()) {
    TITAN_CHECK_NOT_IMPLEMENTED(detail::cuda_record_memory_history(true, kCudaHistoryEntries),
                                "[titan::MemorySnapshotter] expected a build with CUDA for a CUDA memory snapshot, got "
                                "titan built without it. Rebuild with TITAN_ENABLE_CUDA=ON.");
  } else {
    TITAN_CHECK_VALUE(options_.tracker != nullptr,
                      "[titan::MemorySnapshotter] expected the rank's MemoryTracker for a CPU timeline, got none. "
                      "Pass Options::tracker (and book the rank's thread to it with TrackMemory).");
    options_.tracker->record_timeline(true);
  }
  log::info("Memory profiler active: snapshots every {} steps in {}", options_.freq, options_.folder.string());
}

MemorySnapshotter::~MemorySnapshotter() {
  if (options_.device.is_cuda()) {
    detail::cuda_record_memory_history(false, 0);
  } else {
    options_.tracker->record_timeline(false);
  }
}

void MemorySnapshotter::begin_step(int64_t step) {
  if (options_.tracker != nullptr) options_.tracker->mark_step(step);
}

std::optional<std::filesystem::path> MemorySnapshotter::end_step(int64_t step) {
  if (step % options_.freq != 0) return std::nullopt;
  return write(options_.folder / fmt::format("iteration_{}", step), step);
}

std::filesystem::path MemorySnapshotter::write_on_failure(int64_t step) {
  return write(options_.folder / fmt::format("iteration_{}_exit", step - 1), step);
}

std::filesystem::path MemorySnapshotter::write(const std::filesystem::path& dir, int64_t step) {
  const auto begin = std::chrono::steady_clock::now();
  std::filesystem::path path;
  if (options_.device.is_cuda()) {
    path = dir / fmt::format("rank{}_memory_snapshot.pickle", options_.rank);
    const std::optional<std::string> pickled = detail::cuda_memory_snapshot_pickled();
    TITAN_CHECK(pickled.has_value(),
                "[titan::MemorySnapshotter] expected the CUDA allocator's snapshot, got none (built without CUDA).");
    write_text(path, *pickled);
  } else {
    path = dir / fmt::format("rank{}_memory_snapshot.json", options_.rank);
    write_text(path, memory_timeline_json(options_.tracker->take_timeline(), options_.rank, step));
  }
  log::info("Memory snapshot of step {} in {} ({:.2f} s to write)", step, path.string(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  return path;
}

std::string memory_timeline_json(const MemoryTimeline& timeline, int64_t rank, int64_t step) {
  using json = nlohmann::json;
  json categories = json::array();
  for (int c = 0; c < kNumMemoryCategories; ++c) {
    categories.push_back(std::string(memory_category_name(static_cast<MemoryCategory>(c))));
  }
  int64_t base_total = 0;
  for (const int64_t b : timeline.base) base_total += b;
  int64_t peak = base_total;
  json events = json::array();
  for (const auto& e : timeline.events) {
    events.push_back({e.time_ns / 1000, e.bytes, e.category, e.total});
    peak = std::max(peak, e.total);
  }
  json steps = json::array();
  for (const auto& [s, index] : timeline.steps) steps.push_back({{"step", s}, {"event", index}});
  json out = {{"format", "titan.memory_timeline"},
              {"version", 1},
              {"rank", rank},
              {"step", step},
              {"device", "cpu"},
              {"start_unix_us", timeline.start_unix_us},
              {"categories", std::move(categories)},
              {"base_bytes", timeline.base},
              {"base_total_bytes", base_total},
              {"peak_total_bytes", peak},
              {"truncated", timeline.truncated},
              {"columns", {"time_us", "bytes", "category", "total_bytes"}},
              {"steps", std::move(steps)},
              {"peak_resets", timeline.peak_resets},
              {"events", std::move(events)}};
  return out.dump();
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return error != nullptr &&
         std::string_view(error->what_without_backtrace()).find("not enough memory") != std::string_view::npos;
}

}  // namespace titan
