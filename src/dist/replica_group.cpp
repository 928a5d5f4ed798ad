// SPDX-License-Identifier: BSD-3-Clause
// The replica's side of the quorum (one lighthouse or the other: lighthouse.hpp), the cross-replica groups built
// in the store the quorum names, healing, averaging and the commit vote.
#include "titan/dist/replica_group.hpp"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>

#include "lighthouse.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/dist/store.hpp"

namespace titan::dist {

int64_t Quorum::max_step() const { return steps.empty() ? 0 : *std::max_element(steps.begin(), steps.end()); }

bool Quorum::sends() const {
  if (me != source) return false;
  return std::any_of(steps.begin(), steps.end(), [&](int64_t s) { return s < max_step(); });
}

namespace {

// The group's collectives take tensors on its device (NCCL: the rank's GPU); small control values are made
// on the host and moved there, then read back on the host.
at::Tensor on_device(const at::Tensor& host, const ProcessGroup& group) { return host.to(group.device()); }

}  // namespace

namespace detail {

// Lowest replica id at the highest step: every member computes the same one.
int64_t source_of(const Quorum& q) {
  for (size_t i = 0; i < q.replicas.size(); ++i) {
    if (q.steps[i] == q.max_step()) return static_cast<int64_t>(i);
  }
  return -1;
}

std::unique_ptr<Lighthouse> open_lighthouse(const ReplicaOptions& options, int64_t world_size) {
  // TorchFT's lighthouse is addressed as TORCHFT_LIGHTHOUSE addresses it; titan's store by host:port alone.
  constexpr std::string_view kTorchft = "http://";
  if (options.lighthouse.starts_with(kTorchft))
    return torchft_lighthouse(options, options.lighthouse.substr(kTorchft.size()), world_size);
  return store_lighthouse(options);
}

}  // namespace detail

struct ReplicaGroup::Impl {
  Impl(ReplicaOptions o, const ProcessGroup& replica_world)
      : options(std::move(o)), world(std::make_unique<ProcessGroup>(replica_world)) {
    // Only rank 0 meets the other replicas; the others learn the quorum from it.
    if (leader()) lighthouse = detail::open_lighthouse(options, world->size());
  }

  ReplicaOptions options;
  std::unique_ptr<ProcessGroup> world;             // this replica's ranks
  std::unique_ptr<detail::Lighthouse> lighthouse;  // rank 0 only
  std::string rendezvous_address;                  // where the current quorum's groups meet
  std::optional<Store> rendezvous;                 // a client of it
  Quorum quorum{};
  std::unique_ptr<ProcessGroup> replicas;  // this shard rank across the quorum's replicas
  int64_t group_id = -1;                   // quorum id `replicas` was built for
  bool failed = false;                     // this step hit a cross-replica failure
  bool fresh = false;                      // the last step did not commit: rebuild the group

  bool leader() const { return world->rank() == 0; }

  // The leader's quorum to every rank of the replica: (round, id, me, n, address bytes, replica..., step...),
  // then the rendezvous address when it changed (rarely: titan's lighthouse never, TorchFT's with the source).
  Quorum share(const Quorum& q) {
    const int64_t n_max = options.group_size;
    std::string address = leader() ? lighthouse->rendezvous(q) : std::string{};
    at::Tensor t = at::zeros({5 + 2 * n_max}, at::kLong);  // (5 + 2 group_size,)
    if (leader()) {
      auto* p = t.data_ptr<int64_t>();
      p[0] = q.round;
      p[1] = q.id;
      p[2] = q.me;
      p[3] = static_cast<int64_t>(q.replicas.size());
      p[4] = address == rendezvous_address ? 0 : static_cast<int64_t>(address.size());
      for (size_t i = 0; i < q.replicas.size(); ++i) {
        p[5 + i] = q.replicas[i];
        p[5 + n_max + static_cast<int64_t>(i)] = q.steps[i];
      }
    }
    at::Tensor shared = on_device(t, *world);
    world->broadcast(shared, 0).wait();
    t = shared.cpu();
    const auto* p = t.data_ptr<int64_t>();
    Quorum out{.round = p[0], .id = p[1], .replicas = {}, .steps = {}, .me = p[2], .source = -1};
    for (int64_t i = 0; i < p[3]; ++i) {
      out.replicas.push_back(p[5 + i]);
      out.steps.push_back(p[5 + n_max + i]);
    }
    out.source = detail::source_of(out);
    if (p[4] > 0) {
      at::Tensor bytes = at::zeros({p[4]}, at::kByte);  // (address length,)
      if (leader()) std::copy(address.begin(), address.end(), reinterpret_cast<char*>(bytes.data_ptr<uint8_t>()));
      at::Tensor sent = on_device(bytes, *world);
      world->broadcast(sent, 0).wait();
      bytes = sent.cpu();
      rendezvous_address.assign(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(p[4]));
      rendezvous.reset();
    }
    return out;
  }

  void rebuild_group() {
    replicas.reset();
    group_id = quorum.id;
    const auto n = static_cast<int64_t>(quorum.replicas.size());
    try {
      if (!rendezvous) {
        rendezvous = detail::connect_store(rendezvous_address, std::max(options.timeout, options.join_timeout) * 2,
                                           "the quorum's rendezvous");
      }
      replicas = std::make_unique<ProcessGroup>(ProcessGroup::create(
          fmt::format("ft{}", quorum.id), rendezvous->prefixed(fmt::format("group/{}/s{}", quorum.id, world->rank())),
          quorum.me, n, quorum.replicas,
          {.init_timeout = options.timeout,
           .timeout = options.timeout,
           .backend = options.backend,
           .may_fail = true,
           .backend_for_single_rank = false}));
    } catch (const std::exception& e) {
      log::warn("[titan::dist::ReplicaGroup] the cross-replica group of quorum {} (replicas {}) did not form: {}",
                quorum.id, fmt::join(quorum.replicas, ","), error_message(e));
      rendezvous.reset();
      failed = true;
    }
  }
};

ReplicaGroup::ReplicaGroup(ReplicaOptions options, const ProcessGroup& replica_world) {
  TITAN_CHECK_VALUE(options.group_size >= 1 && options.replica_id >= 0 && options.replica_id < options.group_size,
                    "[titan::dist::ReplicaGroup] expected 0 <= replica_id < group_size, got replica_id {} of {}.",
                    options.replica_id, options.group_size);
  impl_ = std::make_unique<Impl>(std::move(options), replica_world);
}

ReplicaGroup::~ReplicaGroup() = default;

const Quorum& ReplicaGroup::quorum(int64_t committed_step) {
  Impl& s = *impl_;
  Quorum q{};
  if (s.leader()) q = s.lighthouse->join(committed_step, s.fresh);
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
  if (s.leader()) verdict.fill_(s.lighthouse->vote(s.quorum, ok.item<int>() == 1) ? 1 : 0);
  s.world->broadcast(verdict, 0).wait();
  const bool committed = verdict.item<int>() == 1;
  s.fresh = !committed;
  return committed;
}

}  // namespace titan::dist
