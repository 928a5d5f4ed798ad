// SPDX-License-Identifier: BSD-3-Clause
// The lighthouse protocol, on a plain key-value store (atomic add, set, blocking get):
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
#include "titan/dist/replica_group.hpp"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/heartbeat.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/dist/store.hpp"

namespace titan::dist {

int64_t Quorum::max_step() const { return steps.empty() ? 0 : *std::max_element(steps.begin(), steps.end()); }

bool Quorum::sends() const {
  if (me != source) return false;
  return std::any_of(steps.begin(), steps.end(), [&](int64_t s) { return s < max_step(); });
}

namespace {

using Clock = std::chrono::steady_clock;

// The group's collectives take tensors on its device (NCCL: the rank's GPU); small control values are made
// on the host and moved there, then read back on the host.
at::Tensor on_device(const at::Tensor& host, const ProcessGroup& group) { return host.to(group.device()); }

struct Ticket {
  int64_t replica = 0;
  int64_t step = 0;
  bool fresh = false;
};

Store connect_lighthouse(const std::string& address, std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  TITAN_CHECK_VALUE(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
                    "[titan::dist::ReplicaGroup] expected the lighthouse as host:port (fault_tolerance.lighthouse "
                    "or TITAN_FT_LIGHTHOUSE), got '{}'. Start titan-lighthouse and pass its address.",
                    address);
  return Store::tcp(address.substr(0, colon), std::stoi(address.substr(colon + 1)), /*is_server=*/false, 1, timeout);
}

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

// Lowest replica id at the highest step: every member computes the same one.
int64_t source_of(const Quorum& q) {
  for (size_t i = 0; i < q.replicas.size(); ++i) {
    if (q.steps[i] == q.max_step()) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

struct ReplicaGroup::Impl {
  Impl(ReplicaOptions o, Store lighthouse, const ProcessGroup& replica_world)
      : options(std::move(o)), world(std::make_unique<ProcessGroup>(replica_world)), store(std::move(lighthouse)) {}

  ReplicaOptions options;
  std::unique_ptr<ProcessGroup> world;  // this replica's ranks
  Store store;
  Quorum quorum{};
  std::unique_ptr<ProcessGroup> replicas;  // this shard rank across the quorum's replicas
  int64_t group_id = -1;                   // quorum id `replicas` was built for
  int64_t next_round = 0;                  // 0: not joined yet (ask the lighthouse)
  bool failed = false;                     // this step hit a cross-replica failure
  bool fresh = false;                      // the last step did not commit: rebuild the group

  bool leader() const { return world->rank() == 0; }

  bool ready(const std::map<int64_t, Ticket>& members, const std::optional<Quorum>& previous, Clock::time_point arrived,
             int64_t step) const {
    const auto size = static_cast<int64_t>(members.size());
    if (const auto wait = options.wait_for.find(step + 1); wait != options.wait_for.end() && size < wait->second)
      return false;
    if (size == options.group_size) return true;
    if (size < options.min_replica_size) return false;
    const bool all_previous = previous && std::all_of(previous->replicas.begin(), previous->replicas.end(),
                                                      [&](int64_t r) { return members.contains(r); });
    return all_previous || Clock::now() - arrived >= options.join_timeout;
  }

  // This replica's rank 0: takes a ticket in the next round and waits until that round is decided.
  Quorum join(int64_t step) {
    int64_t round = next_round > 0 ? next_round : store.add("rounds", 0) + 1;
    const auto give_up = Clock::now() + options.quorum_timeout;
    for (;; ++round) {
      const int64_t ticket = store.add(round_key(round, "joined"), 1);
      store.set(fmt::format("round/{}/ticket/{}", round, ticket),
                fmt::format("{} {} {}", options.replica_id, step, fresh ? 1 : 0));
      std::optional<Quorum> previous;
      if (round > 1) previous = decode_record(store.get(round_key(round - 1, "quorum")), round - 1).quorum;
      const auto arrived = Clock::now();
      std::map<int64_t, Ticket> members;  // by replica id: a restarted replica's newest ticket wins
      int64_t seen = 0;
      while (store.add(round_key(round, "decided"), 0) == 0) {
        for (const int64_t joined = store.add(round_key(round, "joined"), 0); seen < joined; ++seen) {
          std::istringstream in(store.get(fmt::format("round/{}/ticket/{}", round, seen + 1)));
          Ticket t;
          int fresh_flag = 0;
          in >> t.replica >> t.step >> fresh_flag;
          t.fresh = fresh_flag != 0;
          members[t.replica] = t;
        }
        if (ready(members, previous, arrived, step) && store.add(round_key(round, "closed"), 1) == 1) {
          decide(round, seen, members, previous);
          break;
        }
        TITAN_CHECK(Clock::now() < give_up,
                    "[titan::dist::ReplicaGroup] expected at least {} live replicas (fault_tolerance.min_replica_size) "
                    "in round {} within {} s, got {}. Start the missing replica groups or lower min_replica_size.",
                    options.min_replica_size, round, options.quorum_timeout.count() / 1000, members.size());
        report_progress(step + 1, "fault-tolerance quorum");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      Record record = decode_record(store.get(round_key(round, "quorum")), round);
      if (ticket > record.tickets) continue;  // arrived after the decision: the next round
      next_round = round + 1;
      const auto it = std::find(record.quorum.replicas.begin(), record.quorum.replicas.end(), options.replica_id);
      record.quorum.me = it - record.quorum.replicas.begin();
      return record.quorum;
    }
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
    store.set(round_key(round, "quorum"), encode_record(tickets, same ? previous->id : round, members));
    store.add(round_key(round, "decided"), 1);
    store.add("rounds", 1);
  }

  // The leader's quorum to every rank of the replica: (round, id, me, n, replica..., step...).
  Quorum share(const Quorum& q) {
    const int64_t n_max = options.group_size;
    at::Tensor t = at::zeros({4 + 2 * n_max}, at::kLong);  // (4 + 2 group_size,)
    if (leader()) {
      auto* p = t.data_ptr<int64_t>();
      p[0] = q.round;
      p[1] = q.id;
      p[2] = q.me;
      p[3] = static_cast<int64_t>(q.replicas.size());
      for (size_t i = 0; i < q.replicas.size(); ++i) {
        p[4 + i] = q.replicas[i];
        p[4 + n_max + static_cast<int64_t>(i)] = q.steps[i];
      }
    }
    at::Tensor shared = on_device(t, *world);
    world->broadcast(shared, 0).wait();
    t = shared.cpu();
    const auto* p = t.data_ptr<int64_t>();
    Quorum out{.round = p[0], .id = p[1], .replicas = {}, .steps = {}, .me = p[2], .source = -1};
    for (int64_t i = 0; i < p[3]; ++i) {
      out.replicas.push_back(p[4 + i]);
      out.steps.push_back(p[4 + n_max + i]);
    }
    out.source = source_of(out);
    return out;
  }

  void rebuild_group() {
    replicas.reset();
    group_id = quorum.id;
    const auto n = static_cast<int64_t>(quorum.replicas.size());
    try {
      replicas = std::make_unique<ProcessGroup>(ProcessGroup::create(
          fmt::format("ft{}", quorum.id), store.prefixed(fmt::format("group/{}/s{}", quorum.id, world->rank())),
          quorum.me, n, quorum.replicas,
          {.init_timeout = options.timeout,
           .timeout = options.timeout,
           .backend = options.backend,
           .may_fail = true,
           .backend_for_single_rank = false}));
    } catch (const std::exception& e) {
      log::warn("[titan::dist::ReplicaGroup] the cross-replica group of quorum {} (replicas {}) did not form: {}",
                quorum.id, fmt::join(quorum.replicas, ","), error_message(e));
      failed = true;
    }
  }

  bool vote(bool ok) {
    const int64_t round = quorum.round;
    if (!ok) store.add(round_key(round, "fails"), 1);
    store.add(round_key(round, "votes"), 1);
    const auto n = static_cast<int64_t>(quorum.replicas.size());
    // A member that dies before it votes fails the step after the timeout; a failed vote decides at once.
    const auto deadline = Clock::now() + options.timeout;
    while (store.add(round_key(round, "votes"), 0) < n && store.add(round_key(round, "fails"), 0) == 0 &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const bool all = store.add(round_key(round, "votes"), 0) == n && store.add(round_key(round, "fails"), 0) == 0;
    if (store.add(round_key(round, "claim"), 1) == 1) store.set(round_key(round, "verdict"), all ? "1" : "0");
    return store.get(round_key(round, "verdict")) == "1";
  }
};

ReplicaGroup::ReplicaGroup(ReplicaOptions options, const ProcessGroup& replica_world) {
  TITAN_CHECK_VALUE(options.group_size >= 1 && options.replica_id >= 0 && options.replica_id < options.group_size,
                    "[titan::dist::ReplicaGroup] expected 0 <= replica_id < group_size, got replica_id {} of {}.",
                    options.replica_id, options.group_size);
  Store lighthouse = connect_lighthouse(options.lighthouse, std::max(options.timeout, options.join_timeout) * 2);
  impl_ = std::make_unique<Impl>(std::move(options), std::move(lighthouse), replica_world);
}

ReplicaGroup::~ReplicaGroup() = default;

const Quorum& ReplicaGroup::quorum(int64_t committed_step) {
  Impl& s = *impl_;
  Quorum q{};
  if (s.leader()) q = s.join(committed_step);
  s.quorum = s.share(q);
  s.failed = false;
  if (s.quorum.id != s.group_id || s.fresh) s.rebuild_group();
  s.fresh = false;
  return s.quorum;
}

const Quorum& ReplicaGroup::current() const { return impl_->quorum; }

int64_t ReplicaGroup::live() const { return static_cast<int64_t>(impl_->quorum.replicas.size()); }

bool ReplicaGroup::heal(const std::vector<at::Tensor>& tensors, std::string& values) {
  Impl& s = *impl_;
  const Quorum& q = s.quorum;
  if (s.failed || !(q.sends() || q.behind())) return !s.failed;
  try {
    std::vector<int64_t> peers;  // group ranks this rank talks to
    if (q.behind()) {
      peers.push_back(q.source);
    } else {
      for (size_t i = 0; i < q.steps.size(); ++i)
        if (q.steps[i] < q.max_step()) peers.push_back(static_cast<int64_t>(i));
    }
    for (const int64_t peer : peers) {
      int64_t tag = 0;
      for (const at::Tensor& t : tensors) {
        at::Tensor data = t.detach();  // the live tensor's storage: received in place
        TITAN_CHECK(data.is_contiguous(),
                    "[titan::dist::ReplicaGroup] expected contiguous state tensors to heal, got "
                    "one of shape {}.",
                    c10::str(data.sizes()));
        if (q.behind()) {
          s.replicas->recv(data, peer, tag++).wait();
        } else {
          s.replicas->send(data, peer, tag++).wait();
        }
      }
      at::Tensor size = on_device(at::full({1}, static_cast<int64_t>(values.size()), at::kLong), *s.replicas);  // (1,)
      if (q.behind()) {
        s.replicas->recv(size, peer, tag++).wait();
        at::Tensor bytes =
            at::empty({size.item<int64_t>()}, at::TensorOptions(at::kByte).device(size.device()));  // (n,)
        s.replicas->recv(bytes, peer, tag++).wait();
        bytes = bytes.cpu();
        values.assign(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
      } else {
        s.replicas->send(size, peer, tag++).wait();
        at::Tensor bytes = at::empty({static_cast<int64_t>(values.size())}, at::kByte);  // (n,)
        std::copy(values.begin(), values.end(), reinterpret_cast<char*>(bytes.data_ptr<uint8_t>()));
        bytes = on_device(bytes, *s.replicas);
        s.replicas->send(bytes, peer, tag++).wait();
      }
    }
  } catch (const std::exception& e) {
    log::warn("[titan::dist::ReplicaGroup] healing in quorum {} failed: {}", q.id, error_message(e));
    s.failed = true;
  }
  return !s.failed;
}

void ReplicaGroup::average(const std::vector<at::Tensor>& tensors) {
  Impl& s = *impl_;
  if (s.failed || live() == 1) return;
  // One all-reduce per dtype over a packed buffer: the replicas' gradients are few and small next to FSDP's.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& t : tensors)
    if (t.defined()) by_dtype[t.scalar_type()].push_back(t);
  try {
    for (auto& [dtype, group] : by_dtype) {
      std::vector<at::Tensor> flat;
      for (const at::Tensor& t : group) flat.push_back(t.reshape({-1}));
      at::Tensor packed = at::cat(flat);  // (sum numel,)
      s.replicas->all_reduce(packed).wait();
      packed.div_(static_cast<double>(live()));
      int64_t offset = 0;
      for (const at::Tensor& t : group) {
        t.copy_(packed.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  } catch (const std::exception& e) {
    log::warn("[titan::dist::ReplicaGroup] averaging over replicas {} failed: {}", fmt::join(s.quorum.replicas, ","),
              error_message(e));
    s.failed = true;
  }
}

bool ReplicaGroup::commit() {
  Impl& s = *impl_;
  at::Tensor ok = on_device(at::full({1}, s.failed ? 0 : 1, at::kInt), *s.world);  // (1,)
  s.world->all_reduce(ok, ReduceOp::kMin).wait();
  at::Tensor verdict = on_device(at::zeros({1}, at::kInt), *s.world);  // (1,)
  if (s.leader()) verdict.fill_(s.vote(ok.item<int>() == 1) ? 1 : 0);
  s.world->broadcast(verdict, 0).wait();
  const bool committed = verdict.item<int>() == 1;
  s.fresh = !committed;
  return committed;
}

}  // namespace titan::dist
