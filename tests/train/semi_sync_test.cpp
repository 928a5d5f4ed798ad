// SPDX-License-Identifier: BSD-3-Clause
// Semi-synchronous training across replica groups (train/semi_sync.hpp) against a plain ATen reference of the same
// math in one loop. Each replica group is a thread with its own lighthouse client (an in-process titan-lighthouse
// store), its own one-rank world, a tiny linear model and titan's AdamW; the groups meet every kSyncSteps steps in
// titan's outer step (synchronize: quorum, healing through TrainingState, weighted average over the cross-replica
// Gloo group, commit vote, apply). The reference trains the same replicas one after the other with AdamW written
// out in ATen and does the outer step by hand; torchft's own LocalSGD and DiLoCo (tests/oracles/torchft_semi_sync.py)
// run the same job as a second oracle.
//
// Tolerance 1e-5 (absolute, on parameters of order 1): both sides run the same fp32 operations on the same data,
// except that titan's AdamW is the fused kernel and the reference's is the per-tensor formula, which may round
// each update differently by an ulp (~1e-7 here). Over 12 steps such differences stay well below 1e-6; a wrong
// outer step (momentum not Nesterov, the pseudo-gradient's sign, a group counted twice) moves the parameters by
// outer_lr x the pseudo-gradient, ~1e-2, which the test shows the reference would catch.
#include <ATen/ATen.h>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <future>
#include <map>
#include <thread>

#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/core/config.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/dist/replica_group.hpp"
#include "titan/dist/store.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/train/replica_fault_tolerance.hpp"
#include "titan/train/semi_sync.hpp"
#include "titan/train/training_state.hpp"

namespace semi_sync_test {

using titan::SemiSyncMethod;
using titan::SemiSyncOptions;
using Params = std::vector<at::Tensor>;

constexpr int64_t kSyncSteps = 3;
constexpr double kInnerLr = 0.05;
constexpr double kTolerance = 1e-5;

titan::OptimizerConfig inner_config() {
  titan::OptimizerConfig c;
  c.lr = kInnerLr;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  return c;
}

// The model both sides start from: w (4, 3), b (3,).
Params initial_params() {
  const at::Tensor w = at::cos(at::arange(12, at::kFloat).view({4, 3}) * 0.5) * 0.3;  // (4, 3)
  const at::Tensor b = at::zeros({3}, at::kFloat);                                    // (3,)
  return {w, b};
}

// Replica `replica`'s batch of step `step`, a pure function of both (no RNG): x (8, 4), y (8, 3).
std::pair<at::Tensor, at::Tensor> batch(int64_t replica, int64_t step) {
  const at::Tensor i = at::arange(1, 9, at::kFloat).view({8, 1});  // (8, 1)
  const at::Tensor j = at::arange(2, 6, at::kFloat).view({1, 4});  // (1, 4)
  const at::Tensor x = at::sin(i * j * 0.37 + 1.3 * static_cast<double>(step) + 2.1 * static_cast<double>(replica));
  const at::Tensor w_true = at::sin(at::arange(12, at::kFloat).view({4, 3}));  // (4, 3)
  const at::Tensor y = x.mm(w_true) + 0.3 * static_cast<double>(replica);      // (8, 3)
  return {x, y};
}

// The loss's gradients at `p` on replica's batch of step.
Params gradients(const Params& p, int64_t replica, int64_t step) {
  const auto [x, y] = batch(replica, step);
  const at::Tensor w = p[0].detach().requires_grad_(true);
  const at::Tensor b = p[1].detach().requires_grad_(true);
  at::mse_loss(x.mm(w) + b, y).backward();
  return {w.grad(), b.grad()};
}

// ---- titan: one replica group per thread ----

struct GroupRun {
  int64_t replica = 0;
  int64_t last_step = 0;                  ///< the thread stops after this inner step (a "killed" group stops early)
  std::map<int64_t, int64_t> wait_for{};  ///< ReplicaOptions::wait_for
  std::promise<void>* after_step6 = nullptr;
};

struct GroupResult {
  Params params;
  Params last_sync_and_momentum;  // from TrainingState::state(): semi_sync.*
  int64_t step = 0;
};

GroupResult train_group(const GroupRun& run, const SemiSyncOptions& options, const std::string& lighthouse) {
  Params params;
  for (const at::Tensor& p : initial_params()) params.push_back(p.clone().requires_grad_(true));
  titan::AdamW adam(params, inner_config());
  titan::SemiSync outer(options, params);
  titan::TrainingState state({.parameters = params, .names = {"w", "b"}, .optimizer = &adam, .semi_sync = &outer});
  outer.start();
  titan::dist::ReplicaGroup group({.replica_id = run.replica,
                                   .group_size = 2,
                                   .min_replica_size = 1,
                                   .lighthouse = lighthouse,
                                   .join_timeout = std::chrono::milliseconds(300),
                                   .timeout = titan::test::patience(std::chrono::milliseconds(20000)),
                                   .quorum_timeout = titan::test::patience(std::chrono::milliseconds(120000)),
                                   .backend = "gloo",  // plain Gloo: the groups are threads of one process
                                   .wait_for = run.wait_for},
                                  titan::dist::ProcessGroup::single("world"));
  while (state.step < run.last_step) {
    const int64_t step = state.step + 1;
    const Params grads = gradients(params, run.replica, step);
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
    adam.step(kInnerLr);
    state.step = step;
    if (outer.due(step)) {
      titan::synchronize(group, outer, state.step, [&] { titan::heal_state(group, state, run.replica); });
    }
    if (state.step == 6 && run.after_step6 != nullptr) run.after_step6->set_value();
  }
  GroupResult result{.params = {}, .last_sync_and_momentum = {}, .step = state.step};
  for (const at::Tensor& p : params) result.params.push_back(p.detach().clone());
  for (const auto& st : state.state().tensors)
    if (st.key.starts_with("semi_sync.")) result.last_sync_and_momentum.push_back(st.tensor.clone());
  return result;
}

// titan-lighthouse in process: a store that waits for nobody, on a free port.
struct InProcessLighthouse {
  titan::dist::Store store = titan::dist::Store::serve(0, std::chrono::minutes(2));
  std::string address() const { return "127.0.0.1:" + std::to_string(store.port()); }
};

// ---- the reference: the same math, written out, in one loop ----

struct RefReplica {
  Params p, m, v;
  int64_t adam_steps = 0;
};

struct RefOuter {
  Params last_sync, buf;
};

RefReplica ref_start() {
  RefReplica r{.p = initial_params(), .m = {}, .v = {}, .adam_steps = 0};
  for (auto& t : r.p) t = t.clone();
  for (const auto& t : r.p) {
    r.m.push_back(at::zeros_like(t));
    r.v.push_back(at::zeros_like(t));
  }
  return r;
}

// torch.optim.AdamW's step (decoupled weight decay, bias-corrected moments).
void ref_inner_step(RefReplica& r, int64_t replica, int64_t step) {
  const titan::OptimizerConfig c = inner_config();
  const Params g = gradients(r.p, replica, step);
  ++r.adam_steps;
  const double bc1 = 1 - std::pow(c.beta1, static_cast<double>(r.adam_steps));
  const double bc2 = 1 - std::pow(c.beta2, static_cast<double>(r.adam_steps));
  for (size_t i = 0; i < r.p.size(); ++i) {
    r.p[i].mul_(1 - kInnerLr * c.weight_decay);
    r.m[i].mul_(c.beta1).add_(g[i], 1 - c.beta1);
    r.v[i].mul_(c.beta2).addcmul_(g[i], g[i], 1 - c.beta2);
    const at::Tensor denom = (r.v[i].sqrt() / std::sqrt(bc2)).add_(c.eps);
    r.p[i].addcdiv_(r.m[i], denom, -kInnerLr / bc1);
  }
}

// What the reference may get wrong on purpose (the test shows the tolerance would catch it).
struct RefFault {
  bool plain_momentum = false;  ///< momentum without Nesterov's look-ahead
  bool flipped_sign = false;    ///< pseudo-gradient = parameters - last_sync
};

// The outer step over the replicas that count; every replica in `all` takes the result.
void ref_outer_step(const std::vector<RefReplica*>& counting, const std::vector<RefReplica*>& all, RefOuter& outer,
                    const SemiSyncOptions& o, RefFault fault = {}) {
  const auto n = static_cast<double>(counting.size());
  for (size_t i = 0; i < outer.last_sync.size(); ++i) {
    at::Tensor sum = at::zeros_like(outer.last_sync[i]);
    for (const RefReplica* r : counting) {
      const at::Tensor x = o.method == SemiSyncMethod::local_sgd ? r->p[i] : outer.last_sync[i] - r->p[i];
      sum = sum + (fault.flipped_sign ? -x : x);
    }
    const at::Tensor g = sum / n;
    if (o.method == SemiSyncMethod::local_sgd) {
      for (RefReplica* r : all) r->p[i].copy_(g);
      continue;
    }
    outer.buf[i] = outer.buf[i] * o.outer_momentum + g;
    const at::Tensor d =
        (o.outer_nesterov && !fault.plain_momentum) ? g + outer.buf[i] * o.outer_momentum : outer.buf[i];
    outer.last_sync[i] = outer.last_sync[i] - d * o.outer_lr;
    for (RefReplica* r : all) r->p[i] = at::lerp(outer.last_sync[i], r->p[i], o.fragment_update_alpha);
  }
}

RefOuter ref_outer_start() {
  RefOuter o;
  for (const auto& t : initial_params()) {
    o.last_sync.push_back(t.clone());
    o.buf.push_back(at::zeros_like(t));
  }
  return o;
}

// Two replicas, both counting in every outer step, for `steps` steps.
Params ref_two_groups(const SemiSyncOptions& o, int64_t steps, RefFault fault = {}) {
  RefReplica a = ref_start(), b = ref_start();
  RefOuter outer = ref_outer_start();
  for (int64_t step = 1; step <= steps; ++step) {
    ref_inner_step(a, 0, step);
    ref_inner_step(b, 1, step);
    if (step % kSyncSteps == 0) ref_outer_step({&a, &b}, {&a, &b}, outer, o, fault);
  }
  return a.p;
}

double max_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

bool bitwise_equal(const Params& a, const Params& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!at::equal(a[i], b[i])) return false;
  return true;
}

SemiSyncOptions diloco(double alpha = 0.0) {
  return {.method = SemiSyncMethod::diloco,
          .sync_steps = kSyncSteps,
          .outer_lr = 0.7,
          .outer_momentum = 0.9,
          .outer_nesterov = true,
          .fragment_update_alpha = alpha};
}

}  // namespace semi_sync_test

using namespace semi_sync_test;

TEST_CASE("semi-sync: two replica groups after two outer steps equal the plain ATen reference and torchft",
          "[train][fault_tolerance][replica][semi_sync][oracle][full]") {
  const std::vector<std::pair<std::string, SemiSyncOptions>> cases = {
      {"local_sgd", {.method = SemiSyncMethod::local_sgd, .sync_steps = kSyncSteps}},
      {"diloco", diloco()},
      {"diloco, fragment_update_alpha 0.5", diloco(0.5)}};
  const int64_t steps = 2 * kSyncSteps;
  // torchft's own LocalSGD / DiLoCo (pinned in scripts/requirements.txt) on the same model, data and optimizers:
  // every case in one Python process, which imports torch and torchft once.
  const titan::test::TempDir dir;
  const auto torchft_file = [&](size_t i) { return dir.path / fmt::format("torchft-{}.bin", i); };
  std::string torchft_args = fmt::format("{} {}", steps, kSyncSteps);
  for (size_t i = 0; i < cases.size(); ++i) {
    torchft_args += fmt::format(" {} {} \"{}\"", cases[i].first.substr(0, cases[i].first.find(',')),
                                cases[i].second.fragment_update_alpha, torchft_file(i).string());
  }
  REQUIRE(titan::test::run_python("torchft_semi_sync.py", torchft_args) == 0);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [name, options] = cases[i];
    INFO(name);
    const InProcessLighthouse served;
    const std::string lighthouse = served.address();
    // Both wait for each other in the first quorum, however slowly a thread starts.
    auto a =
        std::async(std::launch::async, train_group,
                   GroupRun{.replica = 0, .last_step = steps, .wait_for = {{kSyncSteps + 1, 2}}}, options, lighthouse);
    auto b =
        std::async(std::launch::async, train_group,
                   GroupRun{.replica = 1, .last_step = steps, .wait_for = {{kSyncSteps + 1, 2}}}, options, lighthouse);
    const GroupResult ra = a.get();
    const GroupResult rb = b.get();
    // After an outer step every group holds the same global parameters (and DiLoCo's outer state), bit for bit;
    // fragment_update_alpha > 0 mixes each group's own local parameters back in.
    CHECK(bitwise_equal(ra.params, rb.params) == (options.fragment_update_alpha == 0.0));
    CHECK(bitwise_equal(ra.last_sync_and_momentum, rb.last_sync_and_momentum));
    CHECK(ra.last_sync_and_momentum.size() == (options.method == SemiSyncMethod::diloco ? 4u : 0u));
    const Params reference = ref_two_groups(options, steps);
    const double diff = max_diff(ra.params, reference);
    INFO("largest difference from the reference: " << diff);
    CHECK(diff <= kTolerance);
    std::string bytes = titan::test::read_file(torchft_file(i));
    REQUIRE(bytes.size() == 15 * sizeof(float));
    const at::Tensor torchft = at::from_blob(bytes.data(), {15}, at::kFloat).clone();  // (15,): w (4, 3), then b (3,)
    const double torchft_diff = max_diff({at::cat({ra.params[0].flatten(), ra.params[1].flatten()})}, {torchft});
    INFO("largest difference from torchft: " << torchft_diff);
    CHECK(torchft_diff <= kTolerance);
    // The inner steps alone (no outer step) end elsewhere: the outer steps are what the reference checks.
    RefReplica alone = ref_start();
    for (int64_t step = 1; step <= steps; ++step) ref_inner_step(alone, 0, step);
    CHECK(max_diff(ra.params, alone.p) > 100 * kTolerance);
    if (options.method == SemiSyncMethod::diloco && options.fragment_update_alpha == 0.0) {
      // A reference with the faults titan must not have would fail: the tolerance tells them apart.
      CHECK(max_diff(ra.params, ref_two_groups(options, steps, {.plain_momentum = true})) > 100 * kTolerance);
      CHECK(max_diff(ra.params, ref_two_groups(options, steps, {.flipped_sign = true})) > 100 * kTolerance);
    }
  }
}

TEST_CASE("semi-sync: a replica group killed between outer steps rejoins at the next, healed with the outer state",
          "[train][fault_tolerance][replica][semi_sync]") {
  const SemiSyncOptions options = diloco();
  constexpr int64_t kSteps = 4 * kSyncSteps;  // outer steps after steps 3, 6, 9, 12
  const InProcessLighthouse served;
  const std::string lighthouse = served.address();
  std::promise<void> step6_done;
  // Group 0 trains all 12 steps; its outer step after step 9 waits for 2 groups, so the restarted group 1 is in it.
  auto survivor =
      std::async(std::launch::async, train_group,
                 GroupRun{.replica = 0, .last_step = kSteps, .wait_for = {{4, 2}, {10, 2}}, .after_step6 = &step6_done},
                 options, lighthouse);
  // Group 1 dies after step 4, between the first and the second outer step: group 0 goes on alone after step 6.
  const GroupResult dead = std::async(std::launch::async, train_group,
                                      GroupRun{.replica = 1, .last_step = 4, .wait_for = {{4, 2}}}, options, lighthouse)
                               .get();
  CHECK(dead.step == 4);
  step6_done.get_future().wait();
  // Restarted from nothing (no checkpoint), it trains steps 1-3 alone and meets group 0 in the outer step after
  // step 9: behind, it receives group 0's training state (parameters, AdamW state, last_sync, momentum, step) and
  // counts for nothing in that outer step.
  const GroupResult rejoined =
      std::async(std::launch::async, train_group, GroupRun{.replica = 1, .last_step = kSteps, .wait_for = {{4, 2}}},
                 options, lighthouse)
          .get();
  const GroupResult live = survivor.get();
  CHECK(rejoined.step == kSteps);
  CHECK(bitwise_equal(live.params, rejoined.params));
  CHECK(bitwise_equal(live.last_sync_and_momentum, rejoined.last_sync_and_momentum));

  // The reference: group 1 counts in the outer steps after steps 3 and 12 only; group 0 alone after 6 and 9, where
  // group 1 takes group 0's whole state (its inner steps 1-3 after the restart are thrown away).
  RefReplica a = ref_start(), b = ref_start();
  RefOuter outer = ref_outer_start();
  for (int64_t step = 1; step <= kSteps; ++step) {
    ref_inner_step(a, 0, step);
    if (step <= 4 || step > 9) ref_inner_step(b, 1, step);
    if (step == 3 || step == 12) ref_outer_step({&a, &b}, {&a, &b}, outer, options);
    if (step == 6) ref_outer_step({&a}, {&a}, outer, options);
    if (step == 9) {
      b = a;  // healed: tensors copied, not shared
      for (auto* group : {&b.p, &b.m, &b.v})
        for (auto& t : *group) t = t.clone();
      ref_outer_step({&a}, {&a, &b}, outer, options);
    }
  }
  const double diff = max_diff(live.params, a.p);
  INFO("largest difference from the reference: " << diff);
  CHECK(diff <= kTolerance);
  // The run where group 1 never died ends elsewhere: the reference tells the two apart.
  CHECK(max_diff(live.params, ref_two_groups(options, kSteps)) > 100 * kTolerance);
}
