// SPDX-License-Identifier: BSD-3-Clause
// The flight recorder's store calls with a deadline (src/dist/deadline_store.hpp), on a store whose answers
// the test holds back as a host cut off from the store's host would see them: the call gives up within
// the deadline naming the store, later calls give up at once while it is outstanding, and the store is
// usable again once it answers (for good when it fails late: its connection may be out of step).
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "../../src/dist/deadline_store.hpp"
#include "test_util.hpp"

using titan::dist::detail::DeadlineStore;
using titan::dist::detail::StoreUnreachable;

namespace {

// A store in memory whose check() waits while the test holds it, then answers or fails.
class HeldStore : public c10d::HashStore {
 public:
  bool check(const std::vector<std::string>& keys) override {
    std::unique_lock lock(mutex_);
    ++waiting_;
    cv_.wait(lock, [&] { return !held_; });
    --waiting_;
    if (fail_) throw std::runtime_error("connection reset");
    return c10d::HashStore::check(keys);
  }
  void hold() {
    std::lock_guard lock(mutex_);
    held_ = true;
  }
  void release(bool fail) {
    {
      std::lock_guard lock(mutex_);
      held_ = false;
      fail_ = fail;
    }
    cv_.notify_all();
  }
  // Waits until no call is held in check() any more.
  void drain() {
    std::unique_lock lock(mutex_);
    while (waiting_ > 0) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      lock.lock();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool held_ = false;
  bool fail_ = false;
  int waiting_ = 0;
};

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

TEST_CASE("DeadlineStore: a store that does not answer is unreachable within the deadline and usable once it answers",
          "[dist][flight_recorder]") {
  using namespace std::chrono_literals;
  const auto held = c10::make_intrusive<HeldStore>();
  const DeadlineStore store(held, "the store at 198.18.0.1:29500", 300ms);
  store.set("k", "v");
  CHECK(store.check({"k"}));
  CHECK(store.get("k") == "v");
  CHECK(store.add("n", 2) == 2);
  CHECK(store.multi_get({"k"}) == std::vector<std::string>{"v"});
  CHECK_FALSE(store.unreachable());

  // The store's host stops answering: the call returns within the deadline (plus scheduling), naming it.
  held->hold();
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_MATCHES(
      store.check({"k"}), StoreUnreachable,
      Catch::Matchers::Message("the store at 198.18.0.1:29500 unreachable: expected an answer to check "
                               "within 0.3 s, got none. This host may be cut off from the store's "
                               "host (MASTER_ADDR, rank 0's); check the network between them."));
  CHECK(seconds(std::chrono::steady_clock::now() - start) < titan::test::patience(2.0));
  CHECK(store.unreachable());
  // While that call waits, every other call gives up at once: the connection serves one call at a time.
  const auto again = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(store.set("k", "w"), Catch::Contains("store at 198.18.0.1:29500 unreachable: an earlier call got "
                                                         "no answer within 0.3 s and still waits"));
  CHECK(seconds(std::chrono::steady_clock::now() - again) < 0.1 * titan::test::time_scale());

  // The answer comes late: the store is usable again.
  held->release(false);
  held->drain();
  for (int i = 0; i < 100 && store.unreachable(); ++i) std::this_thread::sleep_for(10ms);
  CHECK_FALSE(store.unreachable());
  CHECK(store.get("k") == "v");

  // A late call that fails leaves the connection in doubt: unreachable for good.
  held->hold();
  CHECK_THROWS_AS(store.check({"k"}), StoreUnreachable);
  held->release(true);
  held->drain();
  std::this_thread::sleep_for(50ms);
  CHECK(store.unreachable());
  CHECK_THROWS_WITH(store.get("k"), Catch::Contains("got no answer within 0.3 s and then failed"));

  // An error within the deadline is the store's own, as before.
  const auto failing = c10::make_intrusive<HeldStore>();
  failing->release(true);
  const DeadlineStore other(failing, "the store", 300ms);
  CHECK_THROWS_WITH(other.check({"k"}), Catch::Contains("connection reset"));
  CHECK_FALSE(other.unreachable());
}

TEST_CASE("DeadlineStore: the failure path's deadline is half the collective timeout within 2..10 s",
          "[dist][flight_recorder]") {
  using namespace std::chrono_literals;
  using titan::dist::detail::store_deadline;
  CHECK(store_deadline(1s) == 2s);
  CHECK(store_deadline(5s) == 2500ms);
  CHECK(store_deadline(12s) == 6s);
  CHECK(store_deadline(100s) == 10s);
  CHECK(titan::dist::detail::store_name(c10::make_intrusive<c10d::HashStore>()) == "the store");
}
