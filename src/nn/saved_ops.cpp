// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/saved_ops.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <utility>

#include "titan/core/error.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/nn/split_backward.hpp"

namespace titan::nn {
namespace {

using torch::autograd::variable_list;

thread_local SavedOps* active_ops_ = nullptr;
thread_local SavedOpsScope::Phase active_phase_ = SavedOpsScope::Phase::record;

// at::linear without bias is matmul(x, w.t()), which folds x's leading dims into one and runs one mm
// when they are laid out contiguously (always so for a weight that requires grad). A kept matmul is
// that mm, so it is kept only when x folds without a copy.
bool folds_as_view(const at::Tensor& x) {
  if (x.dim() < 2) return false;
  for (int64_t i = 0; i + 2 < x.dim(); ++i) {
    if (x.stride(i) != x.stride(i + 1) * x.size(i + 1)) return false;
  }
  return true;
}

std::vector<int64_t> output_shape(const at::Tensor& x, const at::Tensor& w) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(w.size(0));
  return shape;
}

// at::linear(x, w), with a bf16 product on CPU widened where titan widens them (nn/bf16_gemm.hpp). Under
// a split backward the graph at::linear builds (x folded, mm with w.t(), unfolded; the fold copies when it
// must, as at::matmul's does for a weight that requires grad) is built here, so the mm's weight gradient
// can be deferred.
at::Tensor plain_linear(const at::Tensor& x, const at::Tensor& w) {
  const bool split = recording_weight_grads() != nullptr && w.requires_grad() && x.dim() >= 2;
  if (!split && !widens(x, w)) return at::linear(x, w);
  const at::Tensor y2 = nn::mm(x.reshape({-1, x.size(-1)}), w.t());  // (M, out)
  return defer_weight_grad(y2, 1).view(output_shape(x, w));
}

// The backward of mm(x2, wt) with the output kept, computed as autograd's own mm backward computes it
// (the same products, the same operand layouts), so the gradients match the plain op's bitwise.
struct KeptMatmulBackward : torch::autograd::Node {
  KeptMatmulBackward(at::Tensor x2, at::Tensor wt) : x2_(std::move(x2)), wt_(std::move(wt)) {}

  variable_list apply(variable_list&& grads) override {
    const at::Tensor& g = grads[0];  // (M, N)
    at::Tensor dx;
    at::Tensor dw;
    if (g.defined() && task_should_compute_output(0)) {
      // A column-major input gets a column-major gradient.
      const bool column_major = x2_.stride(0) == 1 && x2_.stride(1) == x2_.size(0);
      dx = column_major ? nn::mm(wt_, g.t()).t() : nn::mm(g, wt_.t());
    }
    if (g.defined() && task_should_compute_output(1)) {
      const bool column_major = wt_.stride(0) == 1 && wt_.stride(1) == wt_.size(0);
      dw = column_major ? nn::mm(g.t(), x2_).t() : nn::mm(x2_.t(), g);
    }
    return {dx, dw};
  }
  std::string name() const override { return "titan::KeptMatmulBackward"; }
  void release_variables() override {
    x2_.reset();
    wt_.reset();
  }

 private:
  at::Tensor x2_;  // (M, K) detached
  at::Tensor wt_;  // (K, N) detached
};

void check_unchanged(const SavedOps::Entry& entry) {
  for (size_t i = 0; i < entry.kept.size(); ++i) {
    TITAN_CHECK(entry.kept[i]._version() == entry.versions[i],
                "[titan::nn::SavedOps] expected the kept output of a checkpointed {} to be unchanged until its "
                "recompute, got it modified in place (version {} -> {}). Do not modify an op's output in place "
                "inside a module checkpointed per operator; use an out-of-place op.",
                entry.op, entry.versions[i], entry.kept[i]._version());
  }
}

}  // namespace

SavedOps::SavedOps(std::shared_ptr<const SavedOpPolicy> policy) : policy_(std::move(policy)) {
  TITAN_CHECK_VALUE(policy_ != nullptr, "[titan::nn::SavedOps] expected a policy, got null.");
}

int64_t SavedOps::kept_bytes() const {
  int64_t bytes = 0;
  for (const Entry& e : entries) {
    for (const at::Tensor& t : e.kept) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

SavedOpsScope::SavedOpsScope(SavedOps& ops, Phase phase) : previous_ops_(active_ops_), previous_phase_(active_phase_) {
  active_ops_ = &ops;
  active_phase_ = phase;
  if (phase == Phase::replay) ops.cursor = 0;
}

SavedOpsScope::~SavedOpsScope() {
  active_ops_ = previous_ops_;
  active_phase_ = previous_phase_;
}

detail::ActiveOps detail::active_ops() { return {.ops = active_ops_, .phase = active_phase_}; }

SavedOps::Entry& detail::next_entry(SavedOps& ops, const char* op) {
  TITAN_CHECK(ops.cursor < ops.entries.size() && ops.entries[ops.cursor].op == op,
              "[titan::nn::SavedOps] expected the recompute of a checkpointed module to run the ops its forward "
              "ran, got a {} at op {} where the forward ran {}. A module checkpointed per operator must take the "
              "same path in its recompute (no data- or state-dependent branches).",
              op, ops.cursor, ops.cursor < ops.entries.size() ? ops.entries[ops.cursor].op : "nothing");
  SavedOps::Entry& entry = ops.entries[ops.cursor++];
  check_unchanged(entry);
  return entry;
}

void detail::record_entry(SavedOps& ops, const char* op, std::vector<at::Tensor> kept) {
  SavedOps::Entry entry{.op = op, .kept = std::move(kept)};
  for (const at::Tensor& t : entry.kept) entry.versions.push_back(t._version());
  ops.entries.push_back(std::move(entry));
}

at::Tensor linear(const at::Tensor& x_in, const at::Tensor& w_in, const torch::nn::Module* module) {
  // Under autocast at::linear computes in the autocast dtype; the kept mm below, its rebuilt graph and a
  // widened bf16 product must too, so cast first as autocast would (the weight's cast is cached like
  // at::linear's).
  const at::DeviceType device = x_in.device().type();
  const detail::ActiveOps active = detail::active_ops();
  if (active.ops == nullptr && recording_weight_grads() == nullptr &&
      (device != at::kCPU || bf16_gemm() == Bf16Gemm::native)) {
    return at::linear(x_in, w_in);
  }
  const bool autocast = at::autocast::is_autocast_enabled(device);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
  const at::Tensor x = autocast ? at::autocast::cached_cast(dtype, x_in, device) : x_in;
  const at::Tensor w = autocast ? at::autocast::cached_cast(dtype, w_in, device) : w_in;
  if (active.ops == nullptr) return plain_linear(x, w);
  SavedOps& ops = *active.ops;
  if (active.phase == SavedOpsScope::Phase::record) {
    const bool forced = module != nullptr && ops.policy().force_recompute.contains(module);
    // torchtitan's count: forced matmuls are not counted; of the others the 1st, 3rd, ... are kept.
    const bool keep = !forced && ++ops.matmuls % 2 == 1 && folds_as_view(x);
    if (!keep) {
      detail::record_entry(ops, "matmul", {});
      return plain_linear(x, w);
    }
    at::Tensor y2 = nn::mm(x.reshape({-1, x.size(-1)}), w.t());  // (M, out)
    detail::record_entry(ops, "matmul", {y2});
    return y2.view(output_shape(x, w));
  }
  SavedOps::Entry& entry = detail::next_entry(ops, "matmul");
  if (entry.kept.empty()) return plain_linear(x, w);
  // The graph at::linear builds (w.t(), x folded, mm, unfolded), with the mm's output taken back.
  const at::Tensor wt = w.t();                        // (in, out)
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});  // (M, in)
  at::Tensor y2 = std::exchange(entry.kept[0], {});   // (M, out)
  if (x2.requires_grad() || wt.requires_grad()) {
    auto node = std::shared_ptr<KeptMatmulBackward>(new KeptMatmulBackward(x2.detach(), wt.detach()),
                                                    torch::autograd::deleteNode);
    node->set_next_edges(torch::autograd::collect_next_edges(x2, wt));
    torch::autograd::set_history(y2, node);
    y2 = defer_weight_grad(y2, 1);
  }
  return y2.view(output_shape(x, w));
}

}  // namespace titan::nn
