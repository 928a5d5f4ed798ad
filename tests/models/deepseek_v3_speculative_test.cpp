// SPDX-License-Identifier: BSD-3-Clause
// Self-speculative decoding with DeepSeek-V3's multi-token prediction modules (nn::generate_speculative,
// DeepSeekV3::drafting_model): the tokens are greedy decoding's with the KV cache, whatever the drafts; the counts
// add up; models whose drafts are known to hold, or known to fail, give the exact counts that follow.
#include <ATen/ATen.h>

#include "test_util.hpp"
#include "titan/models/deepseek_v3/model.hpp"
#include "titan/nn/generate.hpp"
#include "titan/nn/init.hpp"
#include "titan/nn/kv_cache.hpp"

namespace deepseek_v3_speculative_test {
namespace {

using namespace titan;

constexpr int64_t kNewTokens = 10;

std::shared_ptr<deepseek_v3::DeepSeekV3> drafting_deepseek(int64_t depth, uint64_t seed) {
  deepseek_v3::DeepSeekV3Args a = deepseek_v3::flavor("tiny");
  a.vocab_size = 256;
  a.max_seq_len = 32;
  a.num_nextn_predict_layers = depth;
  nn::manual_init_seed(seed);
  auto model = deepseek_v3::DeepSeekV3::build(a, {.device = at::kCPU});
  model->init_weights();
  return model;
}

// Plain greedy decoding of the prompts in one left-padded batch over the KV cache.
std::vector<std::vector<int64_t>> cached_greedy(const deepseek_v3::DeepSeekV3& model,
                                                const std::vector<std::vector<int64_t>>& prompts) {
  const nn::CachedForward step = [&](const at::Tensor& t, nn::KVCache& c) { return model.forward_cached(t, c); };
  return nn::generate(step, model.args().n_layers, prompts, {.max_new_tokens = kNewTokens}).tokens;
}

const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 200, 3}, {9}, {44, 45, 46, 47, 48, 49}};

}  // namespace

TEST_CASE("deepseek_v3 self-speculative decoding gives greedy decoding's tokens with 1 and 2 draft depths",
          "[models][deepseek_v3][mtp][generate]") {
  for (const int64_t depth : {1, 2}) {
    INFO("depth " << depth);
    const auto model = drafting_deepseek(depth, 11 + static_cast<uint64_t>(depth));
    const nn::Generation out =
        nn::generate_speculative(model->drafting_model(), kPrompts, {.max_new_tokens = kNewTokens});
    CHECK(out.tokens == cached_greedy(*model, kPrompts));
    const nn::SpeculativeStats& s = out.speculative;
    CHECK(s.generated == kNewTokens * static_cast<int64_t>(kPrompts.size()));
    // Each forward yields its kept drafts and one token of its own.
    CHECK(s.forwards + s.accepted == s.generated);
    CHECK(s.accepted <= s.drafted);
    CHECK(s.drafted <= depth * s.forwards);
  }
}

// All logits 0 (final norms zeroed) make every argmax token 0, the main model's and the drafts' alike: every draft
// holds, and a step of depth 2 yields 3 tokens. With row 0 of the shared head zeroed too but the depths' norms kept,
// a draft is token 0 only if every other logit is negative (chance 2^-255): none holds, one token a forward.
TEST_CASE("deepseek_v3 self-speculative decoding counts drafts that all hold, and drafts that never do",
          "[models][deepseek_v3][mtp][generate]") {
  const std::vector<std::vector<int64_t>> prompt = {{5, 17, 200, 3}};
  const auto model = drafting_deepseek(2, 31);
  at::NoGradGuard no_grad;
  model->norm->weight.zero_();
  {
    const auto agreeing = drafting_deepseek(2, 31);
    agreeing->norm->weight.zero_();
    for (const auto& m : agreeing->mtp->modules) m->norm->weight.zero_();
    const nn::Generation out =
        nn::generate_speculative(agreeing->drafting_model(), prompt, {.max_new_tokens = kNewTokens});
    CHECK(out.tokens == std::vector<std::vector<int64_t>>{std::vector<int64_t>(kNewTokens, 0)});
    // 1 token from the prompt's forward, then 3 + 3 + 3 with two drafts each.
    CHECK(out.speculative.forwards == 4);
    CHECK(out.speculative.drafted == 6);
    CHECK(out.speculative.accepted == 6);
    CHECK(out.speculative.accepted_rate() == 1.0);
    CHECK(out.speculative.tokens_per_forward() == 2.5);
  }
  model->output->weight[0].zero_();
  const nn::Generation out = nn::generate_speculative(model->drafting_model(), prompt, {.max_new_tokens = kNewTokens});
  CHECK(out.tokens == cached_greedy(*model, prompt));
  CHECK(out.speculative.accepted == 0);
  CHECK(out.speculative.forwards == kNewTokens);
  // After the prompt's forward, 9 steps of one token each: 2 drafts while 3 places are left (7 steps), then 1, then
  // none (the step's own token fills the last place).
  CHECK(out.speculative.drafted == 7 * 2 + 1);
}

TEST_CASE("deepseek_v3 self-speculative decoding refuses sampling and a model without draft modules",
          "[models][deepseek_v3][mtp][generate]") {
  const auto model = drafting_deepseek(1, 5);
  CHECK_THAT(test::error_of([&] {
               (void)nn::generate_speculative(model->drafting_model(), kPrompts, {.sampling = {.temperature = 0.7}});
             }),
             Catch::Contains("expected greedy decoding"));
  const auto plain = drafting_deepseek(0, 5);
  CHECK_THAT(test::error_of([&] { (void)plain->drafting_model(); }),
             Catch::Contains("expected a whole model with multi-token prediction modules"));
}

}  // namespace deepseek_v3_speculative_test
