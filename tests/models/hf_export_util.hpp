// SPDX-License-Identifier: BSD-3-Clause
// A family trained by titan and exported to Hugging Face format, read back by transformers: the shared part of the
// families' HF tests (each compares the logits with its own tolerance).
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "test_util.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/models/decoder.hpp"
#include "titan/train/trainer.hpp"
#include "train/train_test_util.hpp"

namespace titan::test {

struct TrainedExport {
  at::Tensor logits;                   // titan's (B, S, V) fp32 on the tokens the oracle read
  double loss = 0;                     // titan's mean next-token cross-entropy on them
  std::filesystem::path oracle_out{};  // what `<oracle> loss` wrote: the HF model's "logits" and "loss"
};

/// Trains `family`'s debugmodel 3 steps with Trainer<models::Decoder> (the HF export at its end), has `oracle`'s
/// `loss DIR TOKENS OUT` read the exported folder on random tokens (B 2, S 16), and returns titan's logits and loss
/// on the same tokens beside the oracle's output.
inline TrainedExport train_and_read_back(const std::filesystem::path& dir, const std::string& family,
                                         const std::string& oracle) {
  JobConfig c = tinyshakespeare_job(dir, /*seq_len=*/32, /*local_batch=*/2, /*steps=*/3, /*seed=*/11);
  c.model.name = family;
  c.checkpoint.enable = true;
  c.checkpoint.last_save_in_hf = true;
  c.metrics.disable_color_printing = true;
  Trainer<models::Decoder> trainer(c);
  trainer.train();
  const std::filesystem::path hf = dir / "checkpoint" / "step-3";
  REQUIRE(std::filesystem::exists(hf / "config.json"));
  const at::Tensor tokens = at::randint(trainer.model().vocab_size(), {2, 17},
                                        at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);  // (B, S+1)
  const std::filesystem::path tokens_file = dir / "tokens.safetensors", out = dir / "hf_loss.safetensors";
  checkpoint::write_safetensors(tokens_file, {{"tokens", tokens}});
  REQUIRE(run_python(oracle,
                     fmt::format("loss \"{}\" \"{}\" \"{}\"", hf.string(), tokens_file.string(), out.string())) == 0);
  at::NoGradGuard no_grad;
  TrainedExport result{.logits = trainer.model().forward(tokens.narrow(1, 0, 16)).to(at::kFloat), .oracle_out = out};
  result.loss = at::cross_entropy_loss(result.logits.flatten(0, 1), tokens.narrow(1, 1, 16).flatten()).item<double>();
  return result;
}

}  // namespace titan::test
