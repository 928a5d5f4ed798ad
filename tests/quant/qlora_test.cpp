// SPDX-License-Identifier: BSD-3-Clause
// QLoRA (lora.quantize_base, quant/qlora.hpp): the adapted Linears' bases held in NF4, the dense weights freed, and a
// QLoRA run's loss curve within a stated bound of LoRA's on the fp32 base from the same init and data.
//
// The bound. Let L(W, A) be the loss of the batch with base weights W and adapters A, the LoRA run at a = (W, A_t)
// and the QLoRA run at b = (W + dW, A'_t), dW = dequantize(to_nf4(W)) - W, and f(s) = L(a + s (b - a)) along the
// segment. By the mean value theorem f(1) - f(0) = f'(xi) for some xi in (0, 1); where f' is monotone on the segment
// (f'' of one sign: L convex or concave along it, no inflection over a step whose weights move by NF4's ~10%),
// f'(xi) lies between f'(0) and f'(1), so
//   |L_qlora - L_lora| <= max(|f'(0)|, |f'(1)|) + 1e-5 |L_lora|,
// f'(0) = grad L(a) . (b - a) from the LoRA run's own gradients (its base weights take gradients that no optimizer
// steps), f'(1) = grad L(b) . (b - a) from a dense probe holding dequantize(W) and the QLoRA adapters, whose loss is
// the QLoRA loss bit for bit (nf4_linear is at::linear on the dequantised weight); 1e-5 |L| covers two fp32 forwards
// (a mean over 64 tokens of a log-sum-exp over 2048 logits, each a few ulps). b - a is measured, both runs being at
// hand: dW, and A'_t - A_t, the adapters' drift. Cauchy-Schwarz instead (sum of ||grad_W L|| ||dW||_F with dW at NF4's
// element bound) holds without the monotonicity but is ~1e4 times the gap here (37 nats against 1e-3): it could pass a
// broken base. The NF4 bytes are checked apart: each element of the QLoRA model's dequantised bases within NF4's
// proven element bound (m g/2 + s, nf4_test_util.hpp), which bytes packed the wrong way fail; the loss bound fails when
// the QLoRA model computes with anything but the NF4 round trip of its base.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "nf4_test_util.hpp"
#include "test_util.hpp"
#include "titan/checkpoint/peft.hpp"
#include "titan/core/config.hpp"
#include "titan/core/memory_tracker.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/layers.hpp"
#include "titan/nn/lora.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/quant/qlora.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace qlora_test {

using namespace titan;
using Catch::Contains;

constexpr int64_t kSeq = 32;

// Llama 3's debug model in two blocks: dim 256, so every Linear (256, 256), (768, 256), (2048, 256) cuts into NF4.
std::shared_ptr<llama3::Llama3> adapted_llama() {
  llama3::Llama3Args args = llama3::flavor("debugmodel");
  args.n_layers = 2;
  nn::manual_init_seed(11);
  auto model = std::make_shared<llama3::Llama3>(args, kSeq, at::TensorOptions());
  nn::add_lora(*model, {.rank = 8, .alpha = 16});  // every Linear, the head included
  model->init_weights();
  nn::init_lora(*model);
  return model;
}

std::map<std::string, at::Tensor> named(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) out[item.key()] = item.value();
  return out;
}

std::vector<at::Tensor> adapters_of(const torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const auto& [name, p] : named(model)) {
    if (nn::is_lora_param(name)) out.push_back(p);
  }
  return out;
}

at::Tensor next_token_loss(llama3::Llama3& model, const at::Tensor& batch) {  // batch (B, S + 1)
  const at::Tensor logits = model.forward(batch.slice(1, 0, kSeq));           // (B, S, V)
  return at::cross_entropy_loss(logits.flatten(0, 1), batch.slice(1, 1).flatten());
}

enum class Nf4Fault { none, swapped_nibbles, scalers_times_factor };

// The fault, made in the NF4 bytes the QLoRA model computes with.
void inject(const quant::NF4Tensor& w, Nf4Fault fault) {
  at::NoGradGuard no_grad;
  if (fault == Nf4Fault::swapped_nibbles) {  // the odd element packed high
    w.codes.copy_(at::bitwise_or(w.codes.bitwise_left_shift(4), w.codes.bitwise_right_shift(4)));
  } else if (fault == Nf4Fault::scalers_times_factor) {  // a dequantiser that multiplies by the factor: absmax x f^2
    w.scaler_factors.copy_(w.scaler_factors.reciprocal());
  }
}

struct CurveCheck {
  std::vector<double> lora, qlora, bound;  // per step
  bool premise = true;                     // each element of the QLoRA model's bases within NF4's element bound
  int64_t violations = 0;                  // steps where |L_qlora - L_lora| > bound
};

// f' at one end of the segment: the gradients there against the step from a to b, summed in double.
double directional(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& step) {
  double d = 0;
  for (size_t i = 0; i < params.size(); ++i)
    d += (params[i].grad().to(at::kDouble) * step[i].to(at::kDouble)).sum().item<double>();
  return d;
}

CurveCheck lora_vs_qlora(int64_t steps, Nf4Fault fault) {
  const auto lora = adapted_llama(), qlora = adapted_llama(), probe = adapted_llama();
  const auto dense = named(*lora);
  const std::vector<quant::QloraBase> bases = quant::quantize_lora_base(*qlora);
  REQUIRE(bases.size() == 2 * 7 + 1);
  CurveCheck out;
  std::vector<at::Tensor> lora_bases, probe_bases, base_step;  // W, W + dW and dW of each adapted Linear
  auto probe_params = named(*probe);
  for (const quant::QloraBase& b : bases) {
    const at::Tensor& w = dense.at(b.path + ".weight");        // (out, in)
    CHECK(named(*qlora).at(b.path + ".weight").numel() == 0);  // the dense weight freed
    at::Tensor& p = probe_params.at(b.path + ".weight");       // (out, in)
    {
      at::NoGradGuard no_grad;
      // What the QLoRA model must compute with: the round trip of its bytes before any fault.
      p.copy_(quant::dequantize(*b.weight));
      inject(*b.weight, fault);
      const at::Tensor error = (quant::dequantize(*b.weight) - w).abs();  // (out, in)
      out.premise = out.premise && error.le(titan::test::nf4_element_bound(w)).all().item<bool>();
      base_step.push_back(p - w);
    }
    lora_bases.push_back(w.requires_grad_(true));  // for dL/dW; no optimizer holds it
    probe_bases.push_back(p.requires_grad_(true));
  }
  OptimizerConfig adamw;
  adamw.lr = 3e-3;
  adamw.weight_decay = 0;
  AdamW lora_opt(adapters_of(*lora), adamw), qlora_opt(adapters_of(*qlora), adamw);
  const std::vector<at::Tensor> probe_adapters = adapters_of(*probe);
  const at::Tensor data = at::randint(2048, {4, 2, kSeq + 1}, at::make_generator<at::CPUGeneratorImpl>(5), at::kLong);
  for (int64_t step = 0; step < steps; ++step) {
    const at::Tensor batch = data[step % 4];  // (2, S + 1)
    const at::Tensor la = next_token_loss(*lora, batch), lq = next_token_loss(*qlora, batch);
    la.backward();
    lq.backward();
    std::vector<at::Tensor> at_a = lora_bases, at_b = probe_bases, segment = base_step;
    const std::vector<at::Tensor> lora_adapters = adapters_of(*lora), qlora_adapters = adapters_of(*qlora);
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < qlora_adapters.size(); ++i) {
        probe_adapters[i].copy_(qlora_adapters[i]);
        segment.push_back(qlora_adapters[i] - lora_adapters[i]);
      }
    }
    at_a.insert(at_a.end(), lora_adapters.begin(), lora_adapters.end());
    at_b.insert(at_b.end(), probe_adapters.begin(), probe_adapters.end());
    const at::Tensor lb = next_token_loss(*probe, batch);
    lb.backward();
    if (fault == Nf4Fault::none) CHECK(at::equal(lb, lq));  // the probe computes the QLoRA loss
    const double bound = std::max(std::abs(directional(at_a, segment)), std::abs(directional(at_b, segment))) +
                         1e-5 * std::abs(la.item<double>());
    out.lora.push_back(la.item<double>());
    out.qlora.push_back(lq.item<double>());
    out.bound.push_back(bound);
    if (std::abs(lq.item<double>() - la.item<double>()) > bound) ++out.violations;
    lora_opt.step(adamw.lr);
    qlora_opt.step(adamw.lr);
    for (const auto* model : {lora.get(), qlora.get(), probe.get()}) {
      for (at::Tensor p : model->parameters()) p.mutable_grad() = at::Tensor();
    }
  }
  return out;
}

TEST_CASE("qlora: a QLoRA run's loss curve stays within the mean-value bound of LoRA's on the fp32 base",
          "[quant][qlora][lora]") {
  const CurveCheck c = lora_vs_qlora(16, Nf4Fault::none);
  CHECK(c.premise);
  CHECK(c.violations == 0);
  for (size_t i = 0; i < c.lora.size(); ++i) {
    INFO("step " << i + 1 << ": lora " << c.lora[i] << ", qlora " << c.qlora[i] << ", bound " << c.bound[i]);
    CHECK(std::abs(c.qlora[i] - c.lora[i]) <= c.bound[i]);
  }
  // Both train (the adapters move the loss), and NF4 moves it too: the curves are not one.
  CHECK(c.lora.back() < c.lora.front() - 0.1);
  CHECK(c.qlora.back() < c.qlora.front() - 0.1);
  CHECK(c.qlora.front() != c.lora.front());
}

TEST_CASE("qlora: the bound's checks catch NF4 bytes packed the wrong way and a base dequantised at the wrong scale",
          "[quant][qlora][lora]") {
  // The odd element in the high nibble: neighbours swapped within a block. dW leaves its element bound, and the loss
  // leaves the mean-value bound.
  const CurveCheck swapped = lora_vs_qlora(1, Nf4Fault::swapped_nibbles);
  CHECK_FALSE(swapped.premise);
  CHECK(swapped.violations > 0);
  // Scalers multiplied by their factor, not divided: the loss leaves the bound at once.
  const CurveCheck scaled = lora_vs_qlora(1, Nf4Fault::scalers_times_factor);
  CHECK_FALSE(scaled.premise);
  CHECK(scaled.violations > 0);
}

TEST_CASE("qlora: adapted Linears compute with the dequantised NF4 base and hold no dense weight",
          "[quant][qlora][lora]") {
  const auto dense = adapted_llama(), qlora = adapted_llama();
  const auto params = named(*dense);
  const int64_t before = storage_bytes(qlora->parameters());
  const std::vector<quant::QloraBase> bases = quant::quantize_lora_base(*qlora);
  int64_t base_bytes = 0, nf4_bytes = 0;
  {
    at::NoGradGuard no_grad;
    for (const quant::QloraBase& b : bases) {
      at::Tensor w = params.at(b.path + ".weight");  // (out, in)
      base_bytes += w.nbytes();
      nf4_bytes += b.weight->nbytes();
      CHECK(b.weight->nbytes() == quant::nf4_nbytes(w.numel(), 4));
      w.copy_(quant::dequantize(*b.weight));
    }
  }
  // The freed weights leave the parameters; the NF4 bytes are about an eighth of fp32's.
  CHECK(storage_bytes(qlora->parameters()) == before - base_bytes);
  CHECK(nf4_bytes * 7 < base_bytes);
  const at::Tensor tokens = at::randint(2048, {2, kSeq}, at::make_generator<at::CPUGeneratorImpl>(2), at::kLong);
  CHECK(at::equal(qlora->forward(tokens), dense->forward(tokens)));
  // A second quantisation finds the matmuls replaced.
  CHECK_THROWS_WITH(quant::quantize_lora_base(*qlora), Contains("layers.0.attention.wq") && Contains("float8"));
}

TEST_CASE("qlora: a QLoRA checkpoint's merge takes the dequantised NF4 bases of the adapted weights",
          "[quant][qlora][lora][checkpoint]") {
  const at::Tensor w = at::randn({64, 256}, at::make_generator<at::CPUGeneratorImpl>(4)) * 0.02;  // (64, 256)
  const at::Tensor other = at::randn({64, 256}, at::make_generator<at::CPUGeneratorImpl>(6));     // (64, 256)
  const nlohmann::json lora = {{"rank", 2}, {"alpha", 4}, {"quantize_base", true}, {"nf4_dtype", "bfloat16"}};
  REQUIRE(checkpoint::nf4_base_dtype(lora) == at::kBFloat16);
  CHECK_FALSE(checkpoint::nf4_base_dtype({{"rank", 2}, {"alpha", 4}}).has_value());
  const auto bases = checkpoint::nf4_bases(
      {{"a.weight", w}, {"b.weight", other}},
      {{"a.lora_a.weight", at::zeros({2, 256})}, {"a.lora_b.weight", at::zeros({64, 2})}}, at::kBFloat16);
  CHECK(at::equal(bases[0].second, quant::dequantize(quant::to_nf4(w.to(at::kBFloat16))).to(at::kFloat)));
  CHECK(at::equal(bases[1].second, other));
}

TEST_CASE("qlora: a base NF4 cannot cut is refused naming its module", "[quant][qlora][lora]") {
  torch::nn::Module root;
  root.register_module("proj", std::make_shared<nn::Linear>(100, 64, at::TensorOptions()));
  nn::add_lora(root, {.rank = 2});
  CHECK_THROWS_WITH(quant::lora_base_linears(root), Contains("'proj.weight'") && Contains("64 x 256") &&
                                                        Contains("[64, 100]") && Contains("lora.target_modules"));
}

}  // namespace qlora_test
