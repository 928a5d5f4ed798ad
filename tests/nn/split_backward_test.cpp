// SPDX-License-Identifier: BSD-3-Clause
// Split backward (nn/split_backward.hpp), layer by layer: the input pass then the weight pass give the
// plain backward's gradients bitwise (Linear in fp32, bf16 native and widened, under per-op AC's kept
// matmul; the grouped experts; RMSNorm in fp32 and bf16), the input pass leaves the weights' gradients
// alone, and the weight pass runs only weight GEMMs (counted as the AC tests count matmuls).
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <functional>
#include <string_view>
#include <vector>

#include "nn/bf16_gemm_scope.hpp"
#include "test_util.hpp"
#include "titan/nn/bf16_gemm.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/moe.hpp"
#include "titan/nn/split_backward.hpp"

namespace titan::test {
namespace {

using Forward = std::function<at::Tensor(const at::Tensor&)>;

struct Grads {
  at::Tensor input;                   // gradient of the layer's input
  std::vector<at::Tensor> params;     // each parameter's .grad
  std::vector<bool> defined_after_i;  // split only: .grad defined right after the input pass
  size_t deferred = 0;                // split only: ops the input pass deferred
};

void clear(const at::Tensor& x, const std::vector<at::Tensor>& params) {
  x.mutable_grad().reset();
  for (const auto& p : params) p.mutable_grad().reset();
}

Grads collect(const at::Tensor& x, const std::vector<at::Tensor>& params) {
  Grads g;
  g.input = x.grad();
  for (const auto& p : params) g.params.push_back(p.grad());
  return g;
}

// The plain backward; with `wrapped` the forward records for a queue that never defers (the wrapped
// nodes' plain backward).
Grads plain(const Forward& f, const at::Tensor& x, const std::vector<at::Tensor>& params, const at::Tensor& dy,
            bool wrapped) {
  clear(x, params);
  at::Tensor y;
  {
    const nn::WeightGradScope record(wrapped ? std::make_shared<nn::WeightGradQueue>() : nullptr);
    y = f(x);
  }
  y.backward(dy);
  return collect(x, params);
}

Grads split(const Forward& f, const at::Tensor& x, const std::vector<at::Tensor>& params, const at::Tensor& dy) {
  clear(x, params);
  auto queue = std::make_shared<nn::WeightGradQueue>();
  at::Tensor y;
  {
    const nn::WeightGradScope record(queue);
    y = f(x);
  }
  {
    const nn::InputGradPass input_pass(*queue);
    y.backward(dy);
  }
  std::vector<bool> after_i;
  for (const auto& p : params) after_i.push_back(p.grad().defined());
  const size_t deferred = queue->size();
  y = at::Tensor();  // the graph is gone; the queue keeps what the weight pass needs
  queue->run_weight_grads();
  Grads g = collect(x, params);
  g.defined_after_i = std::move(after_i);
  g.deferred = deferred;
  return g;
}

void check_equal(const Grads& a, const Grads& b) {
  CHECK(at::equal(a.input, b.input));
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(a.params[i].defined());
    REQUIRE(b.params[i].defined());
    CHECK(at::equal(a.params[i], b.params[i]));
  }
}

// Split and wrapped-plain against plain, bitwise; every parameter's gradient deferred to 'W'.
void check_split(const Forward& f, at::Tensor x, const std::vector<at::Tensor>& params, size_t ops) {
  x.requires_grad_(true);
  at::Tensor dy;
  {
    const at::NoGradGuard no_grad;
    dy = at::randn_like(f(x));
  }
  const Grads reference = plain(f, x, params, dy, /*wrapped=*/false);
  check_equal(plain(f, x, params, dy, /*wrapped=*/true), reference);
  const Grads s = split(f, x, params, dy);
  check_equal(s, reference);
  CHECK(s.deferred == ops);
  for (size_t i = 0; i < params.size(); ++i) CHECK_FALSE(s.defined_after_i[i]);
}

std::shared_ptr<nn::Linear> linear(int64_t in, int64_t out, at::ScalarType dtype) {
  auto l = std::make_shared<nn::Linear>(in, out, at::TensorOptions().dtype(dtype));
  const at::NoGradGuard no_grad;
  l->weight.copy_(at::randn({out, in}));
  return l;
}

std::shared_ptr<nn::GroupedExperts> experts(int64_t dim, int64_t hidden) {
  auto e = std::make_shared<nn::GroupedExperts>(dim, hidden, nn::MoEArgs{.num_experts = 4}, at::TensorOptions());
  const at::NoGradGuard no_grad;
  for (at::Tensor* w : {&e->w1, &e->w2, &e->w3}) w->normal_(0.0, 0.1);
  return e;
}

const at::Tensor kTokensPerExpert = at::tensor({5, 7, 0, 12}, at::kLong);  // 24 tokens over 4 experts

// Runs f with a counter of `op` calls on this thread.
int64_t count_calls(const char* op, const std::function<void()>& f) {
  static thread_local const char* counted = nullptr;
  static thread_local int64_t calls = 0;
  counted = op;
  calls = 0;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::string_view(fn.name()) == counted) ++calls;
        return nullptr;
      }));
  f();
  at::removeCallback(handle);
  return calls;
}

}  // namespace

TEST_CASE("a split backward gives Linear's plain gradients bitwise", "[nn][split_backward]") {
  at::manual_seed(1);
  const auto l = linear(16, 24, at::kFloat);
  const Forward f = [&](const at::Tensor& x) { return l->forward(x); };
  check_split(f, at::randn({2, 5, 16}), {l->weight}, 1);
  // A non-contiguous input folds with a copy, as at::matmul folds it for a weight that requires grad.
  check_split(f, at::randn({5, 2, 16}).transpose(0, 1), {l->weight}, 1);
  check_split(f, at::randn({7, 16}), {l->weight}, 1);
  for (const nn::Bf16Gemm gemm : {nn::Bf16Gemm::native, nn::Bf16Gemm::widened}) {
    INFO("bf16 gemm " << (gemm == nn::Bf16Gemm::native ? "native" : "widened"));
    const Bf16GemmScope scope(gemm);
    const auto b = linear(16, 24, at::kBFloat16);
    check_split([&](const at::Tensor& x) { return b->forward(x); }, at::randn({2, 5, 16}, at::kBFloat16), {b->weight},
                1);
  }
}

TEST_CASE("a split backward gives the grouped experts' and RMSNorm's plain gradients bitwise", "[nn][split_backward]") {
  at::manual_seed(2);
  const auto e = experts(16, 32);
  check_split([&](const at::Tensor& x) { return e->forward(x, kTokensPerExpert); }, at::randn({24, 16}),
              {e->w1, e->w2, e->w3}, 3);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("RMSNorm in " << dtype);
    nn::RMSNorm norm(16, 1e-5, at::TensorOptions().dtype(dtype));
    {
      const at::NoGradGuard no_grad;
      norm.weight.copy_(at::rand({16}) + 0.5);
    }
    const Forward f = [&](const at::Tensor& x) { return norm.forward(x); };
    const at::Tensor x = at::randn({3, 4, 16}).to(dtype);
    // The composed norm is at::rms_norm, bitwise, forward too.
    {
      const nn::WeightGradScope record(std::make_shared<nn::WeightGradQueue>());
      CHECK(at::equal(norm.forward(x.requires_grad_(true)), at::rms_norm(x, {16}, norm.weight, 1e-5)));
    }
    check_split(f, x, {norm.weight}, 1);
  }
}

TEST_CASE("the weight pass runs only weight GEMMs and the input pass none of them", "[nn][split_backward]") {
  at::manual_seed(3);
  const auto a = linear(16, 32, at::kFloat);
  const auto b = linear(32, 32, at::kFloat);
  const auto c = linear(32, 16, at::kFloat);
  const Forward mlp = [&](const at::Tensor& x) { return c->forward(at::relu(b->forward(at::relu(a->forward(x))))); };
  const at::Tensor x = at::randn({4, 8, 16}).requires_grad_(true);
  const at::Tensor dy = at::randn({4, 8, 16});
  // Plain: an input and a weight GEMM per Linear.
  at::Tensor y = mlp(x);
  CHECK(count_calls("aten::mm", [&] { y.backward(dy); }) == 6);
  auto queue = std::make_shared<nn::WeightGradQueue>();
  {
    const nn::WeightGradScope record(queue);
    y = mlp(x);
  }
  CHECK(count_calls("aten::mm", [&] {
          const nn::InputGradPass input_pass(*queue);
          y.backward(dy);
        }) == 3);
  CHECK(count_calls("aten::mm", [&] { CHECK(queue->run_weight_grads() == 3); }) == 3);
  // The experts' three grouped GEMMs: input gradients in 'I', weight gradients in 'W', one each.
  const auto e = experts(16, 32);
  const at::Tensor tokens = at::randn({24, 16}).requires_grad_(true);
  {
    const nn::WeightGradScope record(queue);
    y = e->forward(tokens, kTokensPerExpert);
  }
  CHECK(count_calls("aten::_grouped_mm", [&] {
          const nn::InputGradPass input_pass(*queue);
          y.backward(at::ones_like(y));
        }) == 3);
  CHECK(count_calls("aten::_grouped_mm", [&] { CHECK(queue->run_weight_grads() == 3); }) == 3);
  CHECK(queue->size() == 0);
}

}  // namespace titan::test
