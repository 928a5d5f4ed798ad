// SPDX-License-Identifier: BSD-3-Clause
// Job config -> loaders: the accumulation from training.global_batch_size, mixtures from
// training.dataset_mixture, and the per-key errors.
#include <ATen/ATen.h>

#include "titan/core/error.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/train/data_setup.hpp"

#include <catch2/catch.hpp>

#include "data_test_util.hpp"
#include "test_util.hpp"

using Catch::Matchers::Contains;

TEST_CASE("build_dataloader: accumulation from the global batch and mixtures from the config", "[data]") {
  titan::test::TempDir tmp;
  titan::test::write_file(tmp.path / "a.txt", "alpha beta\n\ngamma delta\n");
  titan::test::write_file(tmp.path / "b.jsonl", "{\"body\": \"zeta eta\"}\n");
  titan::JobConfig c;
  c.training.dataset = "tinyshakespeare";
  c.training.dataset_path = (tmp.path / "a.txt").string();
  c.training.local_batch_size = 2;
  c.training.global_batch_size = 8;
  c.training.seq_len = 8;
  const auto tok = titan::test::tiny_tokenizer();

  CHECK(titan::gradient_accumulation_steps(c, 2) == 2);
  CHECK(titan::gradient_accumulation_steps(c, 4) == 1);
  CHECK_THROWS_AS(titan::gradient_accumulation_steps(c, 3), titan::ConfigError);
  const auto rank1 = titan::build_dataloader(c, tok, 1, 2);
  CHECK(rank1->config().grad_accum_steps == 2);
  CHECK(rank1->global_batch_size() == 8);
  CHECK(rank1->next().input.sizes() == at::IntArrayRef{2, 8});

  // Rank 1 of 2 takes rows 4..7 of the global batch, as 2 microbatches of 2.
  const auto fresh = titan::build_dataloader(c, tok, 1, 2);
  const at::Tensor slice = at::cat({fresh->next().input, fresh->next().input});
  c.training.local_batch_size = 8;
  const at::Tensor all = titan::build_dataloader(c, tok, 0, 1)->next().input;
  CHECK(at::equal(slice, all.slice(0, 4, 8)));

  c.training.dataset_text_field = "body";
  c.training.dataset_format = titan::DatasetFormat::jsonl;
  c.training.dataset_mixture = {"tinyshakespeare:1:" + (tmp.path / "b.jsonl").string()};
  CHECK(titan::build_sources(c).size() == 1);
  c.training.dataset_mixture = {"tinyshakespeare:0"};
  CHECK_THROWS_WITH(titan::build_sources(c), Contains("dataset_mixture") && Contains("tinyshakespeare:0"));
}
