// SPDX-License-Identifier: BSD-3-Clause
// TorchFT's lighthouse as titan's: the lighthouse decides who is in each quorum and its id (its rules: a quorum
// needs --min_replicas heartbeating members, waits --join_timeout_ms for heartbeating stragglers unless every
// member of the previous quorum is back, and bumps the id when the members change or one reports a commit
// failure). What it does not provide goes through a store the members host, as TorchFT's manager does with its
// participants' store_address: each replica's rank 0 serves one, and a quorum meets in the store of its source
// replica (the lowest id at the highest step, the one that heals the others).
//
// A member's replica_id is "<fault_tolerance.replica_id>:<nonce>", new in every process: a restarted replica is a
// new member, so the lighthouse gives the quorum a new id and every member rebuilds its cross-replica groups.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "lighthouse.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/heartbeat.hpp"
#include "torchft_client.hpp"

namespace titan::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// How often rank 0 tells the lighthouse it is alive (TorchFT's manager: 100 ms, against the lighthouse's 5 s
// --heartbeat_timeout_ms), and how long it waits before asking again for a quorum titan finds too small.
constexpr std::chrono::milliseconds kHeartbeatInterval{100};
constexpr std::chrono::milliseconds kRejoinPause{100};

std::string host_name() {
  char name[256] = {};
  TITAN_CHECK(gethostname(name, sizeof(name) - 1) == 0,
              "[titan::dist::ReplicaGroup] expected this host's name for the replica's store address, got none.");
  return name;
}

// Tells this process's member apart from an earlier one of the same replica group.
uint64_t nonce() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

class TorchftLighthouse final : public Lighthouse {
 public:
  TorchftLighthouse(const ReplicaOptions& options, const std::string& target, int64_t world_size)
      : options_(options),
        target_(target),
        client_(target),
        store_(Store::serve(0, std::max(options.timeout, options.join_timeout) * 2)),
        me_{.replica_id = fmt::format("{}:{:016x}", options.replica_id, nonce()),
            .store_address = fmt::format("{}:{}", host_name(), store_.port()),
            .step = 0,
            .world_size = static_cast<uint64_t>(world_size),
            .commit_failures = 0} {
    heartbeats_ = std::thread([this] { beat(); });
  }

  ~TorchftLighthouse() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    heartbeats_.join();
  }

  Quorum join(int64_t step, bool fresh) override {
    me_.step = step;
    me_.commit_failures = fresh ? 1 : 0;
    const auto give_up = Clock::now() + options_.quorum_timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now());
      bool timed_out = left.count() <= 0;
      TorchftQuorum answer;
      if (!timed_out) {
        try {
          answer = client_.quorum(me_, left, timed_out);
        } catch (const std::exception& e) {
          TITAN_CHECK(false,
                      "[titan::dist::ReplicaGroup] expected a quorum from TorchFT's lighthouse at {}, got an error: "
                      "{}. Is torchft_lighthouse running there (fault_tolerance.lighthouse)?",
                      target_, e.what());
        }
      }
      TITAN_CHECK(!timed_out,
                  "[titan::dist::ReplicaGroup] expected a quorum from TorchFT's lighthouse at {} within {} s, got "
                  "none. It decides one once --min_replicas replica groups ask, more than half of those heartbeating, "
                  "and the others asked or --join_timeout_ms passed: start the missing replica groups, or restart the "
                  "lighthouse with a lower --min_replicas or --join_timeout_ms.",
                  target_, options_.quorum_timeout.count() / 1000);
      Quorum q = parse(answer);
      const auto size = static_cast<int64_t>(q.replicas.size());
      const auto wait = options_.wait_for.find(step + 1);
      if (size >= options_.min_replica_size && (wait == options_.wait_for.end() || size >= wait->second)) {
        round_ = q.id == last_id_ ? round_ + 1 : 1;
        last_id_ = q.id;
        q.round = round_;
        return q;
      }
      // Too few for titan (fault_tolerance.min_replica_size): alone in that quorum, ask again.
      report_progress(step + 1, "fault-tolerance quorum");
      std::this_thread::sleep_for(kRejoinPause);
    }
  }

  std::string rendezvous(const Quorum& q) const override {
    return stores_.at(q.replicas.at(static_cast<size_t>(q.source)));
  }

  bool vote(const Quorum& q, bool ok) override {
    // The source's store: a member that died takes its store with it, so a failure here fails the step.
    try {
      const std::string address = rendezvous(q);
      if (address != vote_address_) {
        vote_store_ = connect_store(address, options_.timeout, "a member's store_address");
        vote_address_ = address;
      }
      return store_vote(vote_store_->prefixed(fmt::format("vote/{}/{}", q.id, q.round)),
                        static_cast<int64_t>(q.replicas.size()), ok, options_.timeout);
    } catch (const std::exception& e) {
      log::warn("[titan::dist::ReplicaGroup] the commit vote of quorum {} failed: {}", q.id, error_message(e));
      vote_address_.clear();
      return false;
    }
  }

 private:
  // The lighthouse's members as titan's quorum: replicas ascending by fault_tolerance.replica_id.
  Quorum parse(const TorchftQuorum& answer) {
    std::map<int64_t, const TorchftMember*> by_id;
    for (const TorchftMember& m : answer.participants) {
      const size_t colon = m.replica_id.find(':');
      int64_t id = -1;
      try {
        id = std::stoll(m.replica_id.substr(0, colon));
      } catch (const std::exception&) {
      }
      TITAN_CHECK(id >= 0 && id < options_.group_size && colon != std::string::npos,
                  "[titan::dist::ReplicaGroup] expected quorum members of titan replica groups 0..{} "
                  "(\"<replica_id>:<nonce>\") from the lighthouse at {}, got '{}'. Give each job a lighthouse of "
                  "its own.",
                  options_.group_size - 1, target_, m.replica_id);
      TITAN_CHECK(by_id.emplace(id, &m).second,
                  "[titan::dist::ReplicaGroup] expected one member per replica group in quorum {} of the lighthouse "
                  "at {}, got two with replica_id {}. Each replica group needs its own fault_tolerance.replica_id.",
                  answer.quorum_id, target_, id);
    }
    Quorum q{.round = 0, .id = answer.quorum_id};
    stores_.clear();
    for (const auto& [id, m] : by_id) {
      if (m->replica_id == me_.replica_id) q.me = static_cast<int64_t>(q.replicas.size());
      q.replicas.push_back(id);
      q.steps.push_back(m->step);
      stores_[id] = m->store_address;
    }
    TITAN_CHECK(q.me >= 0, "[titan::dist::ReplicaGroup] expected replica {} in the quorum {} of the lighthouse at {}.",
                me_.replica_id, answer.quorum_id, target_);
    q.source = source_of(q);
    return q;
  }

  // Until destroyed: the lighthouse counts a replica that stops beating as dead after --heartbeat_timeout_ms.
  void beat() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      client_.heartbeat(me_.replica_id, options_.timeout);
      lock.lock();
      wake_.wait_for(lock, kHeartbeatInterval, [&] { return stopping_; });
    }
  }

  ReplicaOptions options_;
  std::string target_;
  TorchftClient client_;
  Store store_;  // this replica's: the quorums whose source it is meet here
  TorchftMember me_;
  std::map<int64_t, std::string> stores_{};  // the last quorum's store_address by replica id
  int64_t last_id_ = -1;
  int64_t round_ = 0;  // quorums so far with id last_id_: the same count on every member
  std::optional<Store> vote_store_{};
  std::string vote_address_{};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread heartbeats_;
};

}  // namespace

std::unique_ptr<Lighthouse> torchft_lighthouse(const ReplicaOptions& options, const std::string& target,
                                               int64_t world_size) {
  return std::make_unique<TorchftLighthouse>(options, target, world_size);
}

}  // namespace titan::dist::detail
