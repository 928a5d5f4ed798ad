// SPDX-License-Identifier: BSD-3-Clause
#include "titan/nn/generate.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "titan/core/error.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/nn/kv_cache.hpp"

namespace titan::nn {

Generation generate(const CachedForward& forward, int64_t n_layers, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerateConfig& config, const at::Device& device, const dist::ProcessGroup* group) {
  TITAN_CHECK_VALUE(!prompts.empty(), "[titan::nn::generate] expected at least one prompt, got none. Pass --prompt.");
  TITAN_CHECK_VALUE(config.max_new_tokens >= 1, "[titan::nn::generate] expected --max-new-tokens >= 1, got {}.",
                    config.max_new_tokens);
  config.sampling.validate();
  const auto bsz = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    TITAN_CHECK_VALUE(!prompts[b].empty(),
                      "[titan::nn::generate] expected non-empty prompts, got an empty prompt {}. Give it text (a "
                      "tokenizer with a BOS token adds one).",
                      b);
    longest = std::max(longest, static_cast<int64_t>(prompts[b].size()));
  }
  // Left padding: every row's last prompt token is in column longest - 1.
  at::Tensor tokens = at::full({bsz, longest}, config.pad_id, at::kLong);  // (B, S)
  at::Tensor pad = at::empty({bsz}, at::kLong);                            // (B)
  for (int64_t b = 0; b < bsz; ++b) {
    const auto& prompt = prompts[static_cast<size_t>(b)];
    const auto len = static_cast<int64_t>(prompt.size());
    pad[b] = longest - len;
    tokens[b].narrow(0, longest - len, len).copy_(at::tensor(prompt, at::kLong));
  }
  const bool padded = pad.max().item<int64_t>() > 0;
  KVCache cache(n_layers, longest + config.max_new_tokens, padded ? pad : at::Tensor());
  at::Generator generator = sampling_generator(config.seed);

  Generation result;
  result.tokens.resize(prompts.size());
  std::vector<bool> finished(prompts.size(), false);
  at::Tensor logits = forward(tokens.to(device), cache).select(1, -1);  // (B, V)
  for (int64_t step = 0; step < config.max_new_tokens; ++step) {
    if (config.keep_logits) result.logits.push_back(logits.to(at::kCPU, at::kFloat));
    at::Tensor next = sample(logits, config.sampling, generator).contiguous();  // (B) on the logits' device
    if (group != nullptr && group->size() > 1) group->broadcast(next, 0).wait();
    next = next.to(at::kCPU);
    bool all_finished = true;
    for (int64_t b = 0; b < bsz; ++b) {
      if (finished[static_cast<size_t>(b)]) continue;
      const int64_t id = next[b].item<int64_t>();
      result.tokens[static_cast<size_t>(b)].push_back(id);
      finished[static_cast<size_t>(b)] = id == config.eos_id;
      all_finished = all_finished && finished[static_cast<size_t>(b)];
    }
    if (all_finished || step + 1 == config.max_new_tokens) break;
    logits = forward(next.view({bsz, 1}).to(device), cache).select(1, -1);  // (B, V)
  }
  return result;
}

Generation generate_speculative(const DraftingModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                const GenerateConfig& config, const at::Device& device) {
  TITAN_CHECK_VALUE(config.sampling.greedy(),
                    "[titan::nn::generate_speculative] expected greedy decoding (temperature 0), got temperature {}. "
                    "Drop --temperature (and --top-k, --top-p), or --speculative-mtp.",
                    config.sampling.temperature);
  TITAN_CHECK_VALUE(model.depth >= 1 && model.forward && model.draft,
                    "[titan::nn::generate_speculative] expected a model with draft modules, got depth {}. Use a model "
                    "with multi-token prediction (model.num_nextn_predict_layers > 0).",
                    model.depth);
  TITAN_CHECK_VALUE(!prompts.empty(), "[titan::nn::generate_speculative] expected at least one prompt, got none.");
  TITAN_CHECK_VALUE(config.max_new_tokens >= 1,
                    "[titan::nn::generate_speculative] expected --max-new-tokens >= 1, got {}.", config.max_new_tokens);
  Generation result;
  SpeculativeStats& stats = result.speculative;
  for (const auto& prompt : prompts) {
    TITAN_CHECK_VALUE(!prompt.empty(), "[titan::nn::generate_speculative] expected non-empty prompts, got one empty.");
    std::vector<int64_t> sequence = prompt;  // the prompt and what is generated so far
    std::vector<int64_t>& out = result.tokens.emplace_back();
    at::Tensor hidden;  // (1, T, D): the last forward's, valid up to the tokens it kept
    while (static_cast<int64_t>(out.size()) < config.max_new_tokens && (out.empty() || out.back() != config.eos_id)) {
      const auto length = static_cast<int64_t>(sequence.size());
      at::Tensor input = at::tensor(sequence, at::kLong).view({1, length}).to(device);  // (1, T)
      at::Tensor drafts;                                                                // (1, n)
      // No draft can be kept past max_new_tokens: the step's own argmax fills the last place.
      const int64_t drafted =
          hidden.defined() ? std::min(model.depth, config.max_new_tokens - static_cast<int64_t>(out.size()) - 1) : 0;
      if (drafted > 0) {
        drafts = model.draft(hidden.narrow(1, 0, length - 1), input).narrow(1, 0, drafted);
        input = at::cat({input, drafts.to(device)}, 1);  // (1, T + n)
      }
      auto [h, logits] = model.forward(input);
      hidden = h;
      ++stats.forwards;
      // Column length - 1 + j: the argmax after the sequence and the first j drafts.
      const at::Tensor greedy =
          logits.select(0, 0).narrow(0, length - 1, drafted + 1).argmax(-1).to(at::kCPU);         // (n+1)
      const at::Tensor proposed = drafted > 0 ? drafts.select(0, 0).to(at::kCPU) : at::Tensor();  // (n)
      stats.drafted += drafted;
      for (int64_t j = 0; j <= drafted; ++j) {
        const int64_t id = greedy[j].item<int64_t>();
        out.push_back(id);
        sequence.push_back(id);
        ++stats.generated;
        if (id == config.eos_id || j == drafted || proposed[j].item<int64_t>() != id) break;
        ++stats.accepted;  // draft j held: the argmax after it is the model's too
      }
    }
  }
  return result;
}

}  // namespace titan::nn
