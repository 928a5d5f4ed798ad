// SPDX-License-Identifier: BSD-3-Clause
#include "strict_backend.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <sstream>
#include <thread>
#include <tuple>

#include "titan/core/error.hpp"

namespace titan::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(const at::Tensor& t) {
  return fmt::format("{} ({})", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

/// What the other side of a message must agree on: NCCL moves count x dtype, whatever the shape.
std::string payload(const at::Tensor& t) { return fmt::format("{} x {}", t.numel(), c10::toString(t.scalar_type())); }

/// "3,3|3,5": the rows an all-to-all sends to each rank, then those it receives from each.
std::string rows_text(const StrictCollective& c) {
  return fmt::format("{}|{}", fmt::join(c.rows_to, ","), fmt::join(c.rows_from, ","));
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> parse_rows(const std::string& text) {
  const auto numbers = [](const std::string& list) {
    std::vector<int64_t> out;
    std::istringstream in(list);
    for (std::string n; std::getline(in, n, ',');) out.push_back(std::stoll(n));
    return out;
  };
  const size_t bar = text.find('|');
  return {numbers(text.substr(0, bar)), numbers(text.substr(bar + 1))};
}

/// The Work of one post(): done once each of its peers' units is.
class BatchWork : public c10d::Work {
 public:
  explicit BatchWork(int64_t parts) : left_(parts) {}
  void part_done(std::exception_ptr error) {
    std::lock_guard lock(error_mutex_);
    if (error && !error_) error_ = error;
    if (--left_ == 0) finish(error_);
  }

 private:
  std::mutex error_mutex_;
  int64_t left_;
  std::exception_ptr error_;
};

}  // namespace

/// This rank's queue of operations toward one peer (NCCL's stream of the pair), run by a thread of its own.
class StrictChannel {
 public:
  struct Unit {
    std::vector<StrictOp> ops;
    std::vector<int64_t> index;  // each op's match index: the k-th send to / receive from the peer
    c10::intrusive_ptr<BatchWork> work;
  };

  StrictChannel(StrictRules& rules, int64_t peer) : rules_(rules), peer_(peer), thread_([this] { run(); }) {}
  ~StrictChannel() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void enqueue(std::vector<StrictOp> ops, const c10::intrusive_ptr<BatchWork>& work) {
    Unit unit{.ops = std::move(ops), .index = {}, .work = work};
    std::lock_guard lock(mutex_);
    for (const StrictOp& op : unit.ops) unit.index.push_back(op.send ? sends_++ : recvs_++);
    queue_.push_back(std::move(unit));
    cv_.notify_all();
  }

 private:
  int64_t me() const { return rules_.rank(); }
  std::string who(int64_t group_rank) const { return rules_.who(group_rank); }
  // Keys: what each side has at the head of its queue. "p/<src>-<dst>/s<k>" is src's k-th send to dst
  // ready to go, "p/<src>-<dst>/r<k>" dst's k-th receive from src posted.
  std::string own_key(const StrictOp& op, int64_t k) const {
    return op.send ? fmt::format("p/{}-{}/s{}", me(), peer_, k) : fmt::format("p/{}-{}/r{}", peer_, me(), k);
  }
  std::string counterpart_key(const StrictOp& op, int64_t k) const {
    return op.send ? fmt::format("p/{}-{}/r{}", me(), peer_, k) : fmt::format("p/{}-{}/s{}", peer_, me(), k);
  }
  std::string head_key(int64_t from, int64_t to) const { return fmt::format("head/{}-{}", from, to); }
  std::string op_text(const StrictOp& op, int64_t k) const {
    return fmt::format("{} #{} {} {} ({}, tag {})", op.send ? "send" : "recv", k, op.send ? "to" : "from", who(op.peer),
                       describe(op.tensor), op.tag);
  }
  std::string unit_text(const Unit& u) const {
    std::vector<std::string> parts;
    for (size_t i = 0; i < u.ops.size(); ++i) parts.push_back(op_text(u.ops[i], u.index[i]));
    return u.ops.size() == 1 ? parts[0] : fmt::format("a batch of [{}]", fmt::join(parts, ", "));
  }

  void set(const std::string& key, const std::string& value) const { rules_.store_set(key, value); }

  void run() {
    for (;;) {
      Unit unit;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        unit = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error = broken_;
      if (!error) {
        try {
          execute(unit);
        } catch (...) {
          error = broken_ = std::current_exception();  // like NCCL's communicator: the pair is broken for good
        }
      }
      // The tensors go before the waiter wakes: released after, they would outlive the wait() that the training
      // thread's memory accounting (and a caller reusing the buffer's memory) counts on.
      const c10::intrusive_ptr<BatchWork> work = std::move(unit.work);
      unit = Unit{};
      work->part_done(error);
    }
  }

  void execute(const Unit& u) {
    const std::string text = unit_text(u);
    set(head_key(me(), peer_), text);
    for (size_t i = 0; i < u.ops.size(); ++i) set(own_key(u.ops[i], u.index[i]), payload(u.ops[i].tensor));
    for (size_t i = 0; i < u.ops.size(); ++i) {
      const StrictOp& op = u.ops[i];
      const std::string key = counterpart_key(op, u.index[i]);
      const std::string theirs = rules_.wait_key(key);
      TITAN_CHECK(!theirs.empty(),
                  "[titan::dist::strict] expected {}'s {} on group '{}' to meet its match within {} s, got none: {} "
                  "is at {}. Under NCCL this hangs: the two ranks post their operations on the pair in different "
                  "orders (both receive first, or both send first). Post them in the same order on both ranks, or "
                  "as one ProcessGroup::batch_isend_irecv.",
                  who(me()), op_text(op, u.index[i]), rules_.group(), rules_.timeout().count() / 1000, who(peer_),
                  peer_head());
      TITAN_CHECK(theirs == payload(op.tensor),
                  "[titan::dist::strict] expected {}'s {} on group '{}' to move as many elements of the same dtype "
                  "as its match on {}, got {} there. NCCL matches the k-th send with the k-th receive of the pair, "
                  "whatever the tags: post them in the same order on both ranks.",
                  who(me()), op_text(op, u.index[i]), rules_.group(), who(peer_), theirs);
      rules_.store_delete(key);  // read once, by this side only
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < u.ops.size(); ++i) {
      std::vector<at::Tensor> tensors{u.ops[i].tensor};
      const int tag = static_cast<int>(u.index[i] % (int64_t{1} << 30));  // the match index: tags play no part
      works.push_back(u.ops[i].send ? rules_.gloo()->send(tensors, static_cast<int>(peer_), tag)
                                    : rules_.gloo()->recv(tensors, static_cast<int>(peer_), tag));
    }
    for (auto& w : works) w->wait();
    set(head_key(me(), peer_), fmt::format("nothing: its last unit, {}, is done", text));
  }

  std::string peer_head() const {
    const std::string key = head_key(peer_, me());
    if (!rules_.store_check(key)) return "nothing: it has posted no operation toward this rank";
    return rules_.store_get(key);
  }

  StrictRules& rules_;
  int64_t peer_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Unit> queue_;
  int64_t sends_ = 0, recvs_ = 0;  // ops posted so far per direction: the next match index
  bool stop_ = false;
  std::exception_ptr broken_;
  std::thread thread_;  // last: starts once the members above exist
};

StrictRules::StrictRules(std::string group, int64_t rank, std::vector<int64_t> global_ranks,
                         c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> gloo,
                         std::chrono::milliseconds timeout, at::Device device)
    : group_(std::move(group)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      store_(std::move(store)),
      gloo_(std::move(gloo)),
      timeout_(timeout),
      device_(device) {
  if (over_network(store_)) bounded_ = DeadlineStore(store_, store_name(store_), store_deadline(timeout_));
}

void StrictRules::store_set(const std::string& key, const std::string& value) const {
  if (bounded_) return bounded_.set(key, value);
  store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string StrictRules::store_get(const std::string& key) const {
  if (bounded_) return bounded_.get(key);
  const std::vector<uint8_t> bytes = store_->get(key);
  return {bytes.begin(), bytes.end()};
}

bool StrictRules::store_check(const std::string& key) const {
  return bounded_ ? bounded_.check({key}) : store_->check({key});
}

void StrictRules::store_delete(const std::string& key) const {
  if (bounded_) return bounded_.delete_key(key);
  store_->deleteKey(key);
}

StrictRules::~StrictRules() {
  alive_ = false;
  channels_.clear();  // joins each queue's thread
}

bool StrictRules::alive() const { return alive_; }

std::string StrictRules::wait_key(const std::string& key) const {
  // Polls rather than Store::wait: a TCP store client holds its lock through a wait, which would stall
  // the other queues' keys for as long.
  const auto deadline = Clock::now() + timeout_;
  auto pause = std::chrono::microseconds(20);
  while (!store_check(key)) {
    if (Clock::now() > deadline || !alive()) return "";
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  return store_get(key);
}

void StrictRules::check_device(const at::Tensor& t, const char* what) const {
  TITAN_CHECK_VALUE(!t.defined() || t.device() == device_,
                    "[titan::dist::strict] expected the {} tensor on group '{}' to be on the group's device {}, got "
                    "{} on {}. NCCL takes device tensors only: create it on the group's device "
                    "(ProcessGroup::device()).",
                    what, group_, device_.str(), describe(t), t.device().str());
}

int64_t StrictRules::publish_collective(const StrictCollective& collective) {
  int64_t seq = 0;
  {
    std::lock_guard lock(mutex_);
    seq = ++collectives_;
  }
  // The rows before the signature: a rank that read the signature finds them.
  if (!collective.rows_to.empty()) store_set(fmt::format("c/{}/{}/rows", seq, rank_), rows_text(collective));
  store_set(fmt::format("c/{}/{}", seq, rank_), collective.signature);
  return seq;
}

std::string StrictRules::who(int64_t group_rank) const {
  return fmt::format("rank {} (global {})", group_rank, global_rank(group_rank));
}

void StrictRules::verify_same(int64_t seq, const std::string& signature, int64_t other) const {
  const std::string theirs = wait_key(fmt::format("c/{}/{}", seq, other));
  TITAN_CHECK(!theirs.empty(),
              "[titan::dist::strict] expected every rank of group '{}' to issue collective #{}, got none from {} "
              "within {} s; {} issued {}. Under NCCL this hangs: every rank must issue the same collectives in the "
              "same order.",
              group_, seq, who(other), timeout_.count() / 1000, who(rank_), signature);
  TITAN_CHECK(theirs == signature,
              "[titan::dist::strict] expected every rank of group '{}' to issue the same collectives in the same "
              "order, got collective #{}: {} issued {}, {} issued {}. Under NCCL the two would be matched with each "
              "other (a hang or wrong data): make every rank take the same path.",
              group_, seq, who(rank_), signature, who(other), theirs);
}

void StrictRules::verify_rows(int64_t seq, const StrictCollective& mine, int64_t other) const {
  const auto [their_to, their_from] = parse_rows(store_get(fmt::format("c/{}/{}/rows", seq, other)));
  const auto me = static_cast<size_t>(rank_), them = static_cast<size_t>(other);
  // Each direction: what the sender sends, what the receiver expects.
  const std::array<std::tuple<int64_t, int64_t, int64_t, int64_t>, 2> directions = {
      std::tuple{rank_, other, mine.rows_to[them], their_from[me]},
      std::tuple{other, rank_, their_to[me], mine.rows_from[them]}};
  for (const auto& [sender, receiver, sent, expected] : directions) {
    TITAN_CHECK(sent == expected,
                "[titan::dist::strict] expected every rank of group '{}' to send each rank as many rows as that rank "
                "receives from it in collective #{} ({}), got {} sending {} rows to {}, which receives {} from it. "
                "Under NCCL the exchange would hang or fill the wrong rows: derive both ranks' splits from one "
                "exchange of the counts, and issue the exchanges in the same order on every rank (two of one row "
                "width swapped on one rank show here).",
                group_, seq, mine.signature, who(sender), sent, who(receiver), expected);
  }
}

void StrictRules::verify_collective(int64_t seq, const StrictCollective& collective) const {
  const int64_t other = rank_ == 0 ? 1 : 0;
  verify_same(seq, collective.signature, other);
  if (collective.rows_to.empty()) return;
  // Rows pair this rank with every other: each must have issued this exchange, with mirrored splits.
  for (int64_t peer = 0; peer < static_cast<int64_t>(global_ranks_.size()); ++peer) {
    if (peer == rank_) continue;
    if (peer != other) verify_same(seq, collective.signature, peer);
    verify_rows(seq, collective, peer);
  }
}

c10::intrusive_ptr<c10d::Work> StrictRules::post(std::vector<StrictOp> ops) {
  std::map<int64_t, std::vector<StrictOp>> by_peer;
  for (StrictOp& op : ops) {
    check_device(op.tensor, op.send ? "send" : "recv");
    by_peer[op.peer].push_back(std::move(op));
  }
  auto work = c10::make_intrusive<BatchWork>(static_cast<int64_t>(by_peer.size()));
  std::lock_guard lock(mutex_);
  for (auto& [peer, peer_ops] : by_peer) {
    auto& channel = channels_[peer];
    if (!channel) channel = std::make_unique<StrictChannel>(*this, peer);
    channel->enqueue(std::move(peer_ops), work);
  }
  return work;
}

std::string collective_signature(const char* op, const at::Tensor& t, const std::string& detail) {
  const std::string what = t.defined() ? payload(t) : "no tensor";
  return detail.empty() ? fmt::format("{} {}", op, what) : fmt::format("{} {} {}", op, what, detail);
}

}  // namespace titan::dist::detail
