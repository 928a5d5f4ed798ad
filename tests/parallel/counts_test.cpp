// SPDX-License-Identifier: BSD-3-Clause
// Parameter and FLOP counts do not depend on when they are asked: the same on the meta device, before
// parallelize and after it under FSDP 2 x TP 2 (each rank then holds a shard of most tensors), for the bundled
// decoder and for a model of one's own (nn::parameter_count over global shapes).
#include <ATen/ATen.h>

#include "parallel/gpt2_model.hpp"
#include "parallel/parity_check.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/nn/counts.hpp"
#include "titan/parallel/parallelize.hpp"
#include "titan/parallel/planner.hpp"

using namespace titan;

namespace {

struct Counts {
  int64_t params = 0;
  int64_t flops = 0;
  int64_t local_elements = 0;  // what this rank holds
};

template <class M>
Counts counts_of(const M& model) {
  Counts c{.params = model.num_params(), .flops = model.num_flops_per_token(32)};
  for (const at::Tensor& p : model.unique_parameters()) c.local_elements += p.numel();
  return c;
}

// The counts of `meta` (shapes only), then of a real model of the same kind before and after FSDP 2 x TP 2.
template <class M, class Build>
void check_invariant(const M& meta, Build build) {
  const Counts whole = counts_of(meta);
  CHECK(whole.params == whole.local_elements);
  CHECK(whole.params == nn::parameter_count(meta));
  dist::run_local_ranks(4, [&](int64_t rank, const dist::Store& store) {
    const dist::Mesh mesh({.dp_shard = 2, .tp = 2}, rank, store, test::kFast);
    const std::shared_ptr<M> model = build();
    const Counts before = counts_of(*model);
    const Parallelized parallel = parallelize(*model, mesh, parallel::plan(model->sharding_spec(), {}, mesh.shape()));
    const Counts after = counts_of(*model);
    RANK_CHECK(before.params == whole.params && before.flops == whole.flops);
    RANK_CHECK_INFO(after.params << " vs " << whole.params, after.params == whole.params);
    RANK_CHECK_INFO(after.flops << " vs " << whole.flops, after.flops == whole.flops);
    // The rank holds far less: a count of its tensors would have changed.
    RANK_CHECK(after.local_elements < whole.params / 2);
  });
}

}  // namespace

TEST_CASE("parameter and FLOP counts are the same before and after FSDP 2 x TP 2, for Llama 3 and a model of its own",
          "[parallel][counts]") {
  SECTION("Llama 3") {
    const llama3::Llama3 meta(test::parity_args(), 32, at::TensorOptions().device(at::kMeta));
    check_invariant(meta,
                    [] { return std::make_shared<llama3::Llama3>(test::parity_args(), 32, at::TensorOptions()); });
  }
  SECTION("a GPT-2-shaped model of its own") {
    const auto meta = test::Gpt2::build({}, {.device = at::kMeta});
    check_invariant(*meta, [] { return test::Gpt2::build({}, {.device = at::kCPU}); });
    // 2 blocks of (4 D^2 + 4 D) attention, (8 D^2 + 5 D) MLP, 4 D norms; V D + P D embeddings (tied head), 2 D norm.
    const int64_t d = 32, v = 128, p = 32;
    CHECK(meta->num_params() == 2 * (12 * d * d + 13 * d) + (v + p) * d + 2 * d);
    CHECK(meta->num_flops_per_token(32) == 6 * (meta->num_params() - p * d) + 6 * 2 * 4 * (2 * 8) * 32);
  }
}
