// SPDX-License-Identifier: BSD-3-Clause
// The parity job (parity_util.hpp: the dim-64 Llama on arithmetic progressions, AdamW at kParityLr) trains.
// Every layout's parity test compares 8 steps with one rank's, and 8 steps do not tell training from batch
// noise: at lr 0 the loss moves by 0.05 from step to step (the batches alone), and the one-rank run falls by
// 0.11 between its first and last two steps, within the 5 sigmas of the shared check (tests/it_trains.hpp).
// 12 steps fall beyond them (measured: the last 4 steps' mean 0.20 below the first 4's), so that the layouts'
// comparisons are of a model that moves.
#include "it_trains.hpp"
#include "parity_util.hpp"

TEST_CASE("parity job: 12 steps on one rank fall beyond the batch noise", "[parallel][parity][train][full]") {
  const titan::test::ParityResult run = titan::test::train_parity(titan::dist::Mesh(), {.steps = 12});
  REQUIRE(run.losses.size() == 12);
  CHECK_TRAINS(run.losses);
}
