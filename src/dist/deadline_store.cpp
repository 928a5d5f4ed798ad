// SPDX-License-Identifier: BSD-3-Clause
#include "deadline_store.hpp"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "titan/core/error.hpp"

namespace titan::dist::detail {

namespace {

// The thread that makes a store's calls, one after another as its connection serves them, started with the first
// call. A thread per call cost the strict backend's three calls a collective a thread start each: 15,564 threads in
// a 12-step, 2-rank job. Detached: a call to an unreachable host may wait in recv for the store's whole timeout; the
// queue outlives the store's state and the thread ends once that state is gone and its queue is empty.
struct Helper {
  std::mutex mutex{};  // guards jobs and closed
  std::condition_variable cv{};
  std::deque<std::function<void()>> jobs{};
  bool closed = false;  // the store's state is gone: no job will come
};

void run_jobs(const std::shared_ptr<Helper>& h) {
  std::unique_lock lock(h->mutex);
  while (true) {
    h->cv.wait(lock, [&] { return h->closed || !h->jobs.empty(); });
    if (h->jobs.empty()) return;
    std::function<void()> job = std::move(h->jobs.front());
    h->jobs.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // may drop the last handle of the store's state, whose destructor takes this lock
    lock.lock();
  }
}

}  // namespace

struct DeadlineStore::State {
  c10::intrusive_ptr<c10d::Store> store{};
  std::string where{};
  std::chrono::milliseconds deadline{};
  std::mutex mutex{};   // guards late, broken and helper
  int late = 0;         // calls past their deadline that have not returned yet
  bool broken = false;  // a call returned an error after its deadline: its connection may be out of step
  std::shared_ptr<Helper> helper{};

  // Runs `job` on the helper thread, started on first use.
  void post(std::function<void()> job) {
    std::shared_ptr<Helper> h;
    {
      std::lock_guard lock(mutex);
      if (!helper) {
        helper = std::make_shared<Helper>();
        std::thread([h = helper] { run_jobs(h); }).detach();
      }
      h = helper;
    }
    {
      std::lock_guard lock(h->mutex);
      h->jobs.push_back(std::move(job));
    }
    h->cv.notify_one();
  }

  ~State() {
    if (!helper) return;
    {
      std::lock_guard lock(helper->mutex);
      helper->closed = true;
    }
    helper->cv.notify_one();
  }
};

namespace {

std::string seconds_text(std::chrono::milliseconds d) {
  return fmt::format("{:g}", static_cast<double>(d.count()) / 1000);
}

// One call's result, shared by the caller and the helper thread (which may outlive the caller's wait).
template <typename T>
struct Call {
  std::mutex mutex{};
  std::condition_variable cv{};
  bool done = false;
  bool late = false;  // the caller stopped waiting
  std::optional<T> value{};
  std::exception_ptr error{};
};

template <typename T, typename F>
T call_within(const std::shared_ptr<DeadlineStore::State>& s, const char* op, F fn) {
  TITAN_CHECK(s != nullptr, "[titan::dist::DeadlineStore] expected a store, got an empty handle.");
  {
    std::lock_guard lock(s->mutex);
    if (s->late > 0 || s->broken) {
      throw StoreUnreachable(
          fmt::format("{} unreachable: an earlier call got no answer within {} s{}. This host may be cut off from the "
                      "store's host (MASTER_ADDR, rank 0's); check the network between them.",
                      s->where, seconds_text(s->deadline), s->broken ? " and then failed" : " and still waits"));
    }
  }
  auto call = std::make_shared<Call<T>>();
  // The job holds the store and its result; nothing else of the caller.
  s->post([s, call, fn = std::make_shared<F>(std::move(fn))] {
    std::optional<T> value;
    std::exception_ptr error;
    try {
      value = (*fn)(*s->store);
    } catch (...) {
      error = std::current_exception();
    }
    bool late = false;
    {
      std::lock_guard lock(call->mutex);
      call->value = std::move(value);
      call->error = error;
      call->done = true;
      late = call->late;
    }
    call->cv.notify_all();
    if (late) {
      std::lock_guard lock(s->mutex);
      --s->late;
      if (error) s->broken = true;
    }
  });
  std::unique_lock lock(call->mutex);
  if (!call->cv.wait_for(lock, s->deadline, [&] { return call->done; })) {
    call->late = true;
    {
      // Counted while the call's lock is held: the helper reads `late` under it, so it decrements after this.
      std::lock_guard state_lock(s->mutex);
      ++s->late;
    }
    throw StoreUnreachable(
        fmt::format("{} unreachable: expected an answer to {} within {} s, got none. This host may be cut off "
                    "from the store's host (MASTER_ADDR, rank 0's); check the network between them.",
                    s->where, op, seconds_text(s->deadline)));
  }
  if (call->error) std::rethrow_exception(call->error);
  return std::move(*call->value);
}

const c10d::TCPStore* tcp_under(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> base = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(base.get())) base = prefixed->getUnderlyingNonPrefixStore();
  return dynamic_cast<const c10d::TCPStore*>(base.get());
}

}  // namespace

DeadlineStore::DeadlineStore(c10::intrusive_ptr<c10d::Store> store, std::string where,
                             std::chrono::milliseconds deadline)
    : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->where = std::move(where);
  state_->deadline = deadline;
}

std::string store_name(const c10::intrusive_ptr<c10d::Store>& store) {
  const c10d::TCPStore* tcp = tcp_under(store);
  if (tcp == nullptr) return "the store";
  const std::string& host = tcp->getHost();
  return host.find(':') == std::string::npos ? fmt::format("the store at {}:{}", host, tcp->getPort())
                                             : fmt::format("the store at [{}]:{}", host, tcp->getPort());
}

DeadlineStore DeadlineStore::own_connection(const c10::intrusive_ptr<c10d::Store>& store,
                                            std::chrono::milliseconds deadline) {
  // clone(): a client of its own (a prefixed view keeps its prefix), connected now, while the store's host
  // answers (the ranks just met there).
  return DeadlineStore(tcp_under(store) != nullptr ? store->clone() : store, store_name(store), deadline);
}

const std::string& DeadlineStore::where() const { return state_->where; }

std::chrono::milliseconds DeadlineStore::deadline() const { return state_->deadline; }

bool DeadlineStore::unreachable() const {
  std::lock_guard lock(state_->mutex);
  return state_->late > 0 || state_->broken;
}

void DeadlineStore::set(const std::string& key, const std::string& value) const {
  call_within<bool>(state_, "set", [key, value](c10d::Store& store) {
    store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
    return true;
  });
}

std::string DeadlineStore::get(const std::string& key) const {
  return call_within<std::string>(state_, "get", [key](c10d::Store& store) {
    const std::vector<uint8_t> bytes = store.get(key);
    return std::string(bytes.begin(), bytes.end());
  });
}

int64_t DeadlineStore::add(const std::string& key, int64_t delta) const {
  return call_within<int64_t>(state_, "add", [key, delta](c10d::Store& store) { return store.add(key, delta); });
}

bool DeadlineStore::check(const std::vector<std::string>& keys) const {
  return call_within<bool>(state_, "check", [keys](c10d::Store& store) { return store.check(keys); });
}

std::vector<std::string> DeadlineStore::multi_get(const std::vector<std::string>& keys) const {
  return call_within<std::vector<std::string>>(state_, "multiGet", [keys](c10d::Store& store) {
    std::vector<std::string> out;
    for (const auto& bytes : store.multiGet(keys)) out.emplace_back(bytes.begin(), bytes.end());
    return out;
  });
}

void DeadlineStore::delete_key(const std::string& key) const {
  call_within<bool>(state_, "deleteKey", [key](c10d::Store& store) { return store.deleteKey(key); });
}

bool over_network(const c10::intrusive_ptr<c10d::Store>& store) { return tcp_under(store) != nullptr; }

std::chrono::milliseconds store_deadline(std::chrono::milliseconds timeout) {
  return std::clamp<std::chrono::milliseconds>(timeout / 2, std::chrono::seconds(2), std::chrono::seconds(10));
}

}  // namespace titan::dist::detail
