// SPDX-License-Identifier: BSD-3-Clause
// titan's lighthouse: the quorum rounds on a plain key-value store (atomic add, set, blocking get), served by
// titan-lighthouse:
//
//   rounds                     rounds decided so far
//   round/R/joined             tickets handed out in round R (a replica's rank 0 takes one per attempt)
//   round/R/ticket/K           "replica step fresh" of ticket K
//   round/R/closed             the first member to see the round ready and take this (add -> 1) decides
//   round/R/quorum             "tickets id n replica step ..." (tickets: 1..tickets are in)
//   round/R/decided            set after quorum: members poll it
//   round/R/fails, votes       the commit vote: a failed member adds to fails before it votes
//   round/R/claim, verdict     the first member to see every vote (or the vote timeout) writes the verdict
//   group/<id>/s<rank>/...     the cross-replica process group of shard rank s of quorum id
//
// A round is decided by whichever member first sees it ready: every replica of the previous quorum arrived (or
// all group_size), or join_timeout passed with at least min_replica_size.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "lighthouse.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/heartbeat.hpp"

namespace titan::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

struct Ticket {
  int64_t replica = 0;
  int64_t step = 0;
  bool fresh = false;
};

std::string round_key(int64_t round, const char* what) { return fmt::format("round/{}/{}", round, what); }

// The quorum record: "tickets id n replica step replica step ...".
std::string encode_record(int64_t tickets, int64_t id, const std::map<int64_t, Ticket>& members) {
  std::string text = fmt::format("{} {} {}", tickets, id, members.size());
  for (const auto& [replica, t] : members) text += fmt::format(" {} {}", replica, t.step);
  return text;
}

struct Record {
  int64_t tickets = 0;
  Quorum quorum{};
};

Record decode_record(const std::string& text, int64_t round) {
  std::istringstream in(text);
  Record r;
  size_t n = 0;
  in >> r.tickets >> r.quorum.id >> n;
  r.quorum.round = round;
  for (size_t i = 0; i < n; ++i) {
    int64_t replica = 0, step = 0;
    in >> replica >> step;
    r.quorum.replicas.push_back(replica);
    r.quorum.steps.push_back(step);
  }
  TITAN_CHECK(!in.fail(),
              "[titan::dist::ReplicaGroup] expected a quorum record in round {}, got '{}'. Is another job "
              "using the same lighthouse?",
              round, text);
  return r;
}

class StoreLighthouse final : public Lighthouse {
 public:
  explicit StoreLighthouse(const ReplicaOptions& options)
      : options_(options),
        store_(connect_store(options.lighthouse, std::max(options.timeout, options.join_timeout) * 2,
                             "fault_tolerance.lighthouse or TITAN_FT_LIGHTHOUSE")) {}

  // Takes a ticket in the next round and waits until that round is decided.
  Quorum join(int64_t step, bool fresh) override {
    int64_t round = next_round_ > 0 ? next_round_ : store_.add("rounds", 0) + 1;
    const auto give_up = Clock::now() + options_.quorum_timeout;
    for (;; ++round) {
      const int64_t ticket = store_.add(round_key(round, "joined"), 1);
      store_.set(fmt::format("round/{}/ticket/{}", round, ticket),
                 fmt::format("{} {} {}", options_.replica_id, step, fresh ? 1 : 0));
      std::optional<Quorum> previous;
      if (round > 1) previous = decode_record(store_.get(round_key(round - 1, "quorum")), round - 1).quorum;
      const auto arrived = Clock::now();
      std::map<int64_t, Ticket> members;  // by replica id: a restarted replica's newest ticket wins
      int64_t seen = 0;
      while (store_.add(round_key(round, "decided"), 0) == 0) {
        for (const int64_t joined = store_.add(round_key(round, "joined"), 0); seen < joined; ++seen) {
          std::istringstream in(store_.get(fmt::format("round/{}/ticket/{}", round, seen + 1)));
          Ticket t;
          int fresh_flag = 0;
          in >> t.replica >> t.step >> fresh_flag;
          t.fresh = fresh_flag != 0;
          members[t.replica] = t;
        }
        if (ready(members, previous, arrived, step) && store_.add(round_key(round, "closed"), 1) == 1) {
          decide(round, seen, members, previous);
          break;
        }
        TITAN_CHECK(Clock::now() < give_up,
                    "[titan::dist::ReplicaGroup] expected at least {} live replicas (fault_tolerance.min_replica_size) "
                    "in round {} within {} s, got {}. Start the missing replica groups or lower min_replica_size.",
                    options_.min_replica_size, round, options_.quorum_timeout.count() / 1000, members.size());
        report_progress(step + 1, "fault-tolerance quorum");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      Record record = decode_record(store_.get(round_key(round, "quorum")), round);
      if (ticket > record.tickets) continue;  // arrived after the decision: the next round
      next_round_ = round + 1;
      const auto it = std::find(record.quorum.replicas.begin(), record.quorum.replicas.end(), options_.replica_id);
      record.quorum.me = it - record.quorum.replicas.begin();
      return record.quorum;
    }
  }

  std::string rendezvous(const Quorum&) const override { return options_.lighthouse; }

  bool vote(const Quorum& q, bool ok) override {
    return store_vote(store_.prefixed(fmt::format("round/{}", q.round)), static_cast<int64_t>(q.replicas.size()), ok,
                      options_.timeout);
  }

 private:
  bool ready(const std::map<int64_t, Ticket>& members, const std::optional<Quorum>& previous, Clock::time_point arrived,
             int64_t step) const {
    const auto size = static_cast<int64_t>(members.size());
    if (const auto wait = options_.wait_for.find(step + 1); wait != options_.wait_for.end() && size < wait->second)
      return false;
    if (size == options_.group_size) return true;
    if (size < options_.min_replica_size) return false;
    const bool all_previous = previous && std::all_of(previous->replicas.begin(), previous->replicas.end(),
                                                      [&](int64_t r) { return members.contains(r); });
    return all_previous || Clock::now() - arrived >= options_.join_timeout;
  }

  void decide(int64_t round, int64_t tickets, const std::map<int64_t, Ticket>& members,
              const std::optional<Quorum>& previous) {
    std::vector<int64_t> ids;
    bool any_fresh = false;
    for (const auto& [replica, t] : members) {
      ids.push_back(replica);
      any_fresh = any_fresh || t.fresh;
    }
    const bool same = previous && previous->replicas == ids && !any_fresh;
    store_.set(round_key(round, "quorum"), encode_record(tickets, same ? previous->id : round, members));
    store_.add(round_key(round, "decided"), 1);
    store_.add("rounds", 1);
  }

  ReplicaOptions options_;
  Store store_;
  int64_t next_round_ = 0;  // 0: not joined yet (ask the lighthouse)
};

}  // namespace

std::unique_ptr<Lighthouse> store_lighthouse(const ReplicaOptions& options) {
  return std::make_unique<StoreLighthouse>(options);
}

Store connect_store(const std::string& address, std::chrono::milliseconds timeout, const char* what) {
  const size_t colon = address.rfind(':');
  TITAN_CHECK_VALUE(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
                    "[titan::dist::ReplicaGroup] expected a store as host:port ({}), got '{}'. Start titan-lighthouse "
                    "and pass its address, or http://host:port of a torchft_lighthouse.",
                    what, address);
  return Store::tcp(address.substr(0, colon), std::stoi(address.substr(colon + 1)), /*is_server=*/false, 1, timeout);
}

bool store_vote(const Store& store, int64_t members, bool ok, std::chrono::milliseconds timeout) {
  if (!ok) store.add("fails", 1);
  store.add("votes", 1);
  // A member that dies before it votes fails the step after the timeout; a failed vote decides at once.
  const auto deadline = Clock::now() + timeout;
  while (store.add("votes", 0) < members && store.add("fails", 0) == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const bool all = store.add("votes", 0) == members && store.add("fails", 0) == 0;
  if (store.add("claim", 1) == 1) store.set("verdict", all ? "1" : "0");
  return store.get("verdict") == "1";
}

}  // namespace titan::dist::detail
