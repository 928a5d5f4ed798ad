// SPDX-License-Identifier: BSD-3-Clause
// The pipeline split by cost (parallelism.pipeline_parallel_split = flops): optimal against every cut of
// small cases, exact where an exact balance exists, the FLOPs of a Llama 3 summing to its
// num_flops_per_token; and the default split still torchtitan's.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <numeric>

#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/models/decoder_spec.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/parallel/pipeline_schedule.hpp"
#include "titan/parallel/planner.hpp"

using namespace titan;
using namespace titan::parallel;
using Catch::Contains;
using Parts = std::vector<std::vector<std::string>>;

namespace {

PipelineSplit llm(int64_t layers) {
  PipelineSplit split{.input_modules = {"tok_embeddings"}, .output_modules = {"norm", "output"}};
  for (int64_t i = 0; i < layers; ++i) split.layer_modules.push_back(fmt::format("layers.{}", i));
  return split;
}

// The stages a pipeline plan cuts a Llama 3 of `args` into, its blocks weighed at seq_len tokens.
Parts split_of(const llama3::Llama3Args& args, int64_t seq_len, int64_t pp, const ParallelismConfig& p) {
  const ShardingSpec spec = llama3::Llama3(args, seq_len, at::TensorOptions().device(at::kMeta)).sharding_spec();
  return parallel::pipeline_plan(spec.pipeline, spec.pipeline_costs, pp, p).stages;
}

double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

/// The least (largest stage, sum of squares) over every cut of `items` into `stages` non-empty runs.
std::pair<double, double> best_by_enumeration(const std::vector<double>& items, int64_t stages) {
  std::pair<double, double> best{1e300, 1e300};
  const auto n = static_cast<int64_t>(items.size());
  std::vector<int64_t> cuts;  // run ends, increasing
  std::function<void(int64_t)> next = [&](int64_t from) {
    if (static_cast<int64_t>(cuts.size()) == stages - 1) {
      double worst = 0, squares = 0;
      int64_t begin = 0;
      for (int64_t s = 0; s < stages; ++s) {
        const int64_t end = s < stages - 1 ? cuts[static_cast<size_t>(s)] : n;
        const double c = std::accumulate(items.begin() + begin, items.begin() + end, 0.0);
        worst = std::max(worst, c), squares += c * c, begin = end;
      }
      best = std::min(best, std::pair{worst, squares});
      return;
    }
    for (int64_t end = from; end < n; ++end) {
      cuts.push_back(end);
      next(end + 1);
      cuts.pop_back();
    }
  };
  next(1);
  return best;
}

}  // namespace

TEST_CASE("the cost split balances stages exactly where a balance exists", "[parallel][pipeline][split]") {
  // 15 blocks of cost 1, a free embedding, a head of cost 1: 8 stages of 2.
  const PipelineModuleCosts costs{.input = 0, .layers = std::vector<double>(15, 1.0), .output = 1};
  const Parts parts = balance_pipeline_stages(llm(15), costs, 8);
  const std::vector<double> stage = pipeline_stage_costs(llm(15), costs, parts);
  CHECK(stage == std::vector<double>(8, 2.0));
  CHECK(parts.front() == std::vector<std::string>{"tok_embeddings", "layers.0", "layers.1"});
  CHECK(parts.back() == std::vector<std::string>{"layers.14", "norm", "output"});
  // A cheaper dense first block before MoE blocks, a head worth two blocks of 1 (DeepSeek-V3-like):
  // 25 over 5 stages cannot be 5 each (two MoE blocks make 6), so the largest is 6.
  const PipelineModuleCosts moe{.input = 0, .layers = {2, 3, 3, 3, 3, 3, 3, 3}, .output = 2};
  const std::vector<double> moe_stage = pipeline_stage_costs(llm(8), moe, balance_pipeline_stages(llm(8), moe, 5));
  CHECK(max_of(moe_stage) == 6);
  CHECK(moe_stage.front() == 5);  // the embedding, the dense block and one MoE block
}

TEST_CASE("the cost split is the least largest stage, then the evenest", "[parallel][pipeline][split]") {
  const std::vector<std::vector<double>> cases = {
      {0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.55},  // the debug model: free embedding, 6 blocks, lighter head
      {0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 8.5},   // a large vocabulary: the head outweighs the blocks
      {0.1, 0.3, 2.0, 2.0, 0.5, 0.5, 3.0, 1.0, 0.2},
      {0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0},  // zero costs still leave every stage a module
  };
  for (const auto& items : cases) {
    const auto layers = static_cast<int64_t>(items.size()) - 2;
    const PipelineModuleCosts costs{
        .input = items.front(), .layers = {items.begin() + 1, items.end() - 1}, .output = items.back()};
    for (int64_t stages = 1; stages <= static_cast<int64_t>(items.size()); ++stages) {
      const Parts parts = balance_pipeline_stages(llm(layers), costs, stages);
      REQUIRE(static_cast<int64_t>(parts.size()) == stages);
      for (const auto& part : parts) CHECK(!part.empty());
      const std::vector<double> stage = pipeline_stage_costs(llm(layers), costs, parts);
      double squares = 0;
      for (double c : stage) squares += c * c;
      const auto [worst, least_squares] = best_by_enumeration(items, stages);
      CHECK(max_of(stage) == Approx(worst));
      CHECK(squares == Approx(least_squares));
    }
  }
}

TEST_CASE("the cost split says what is wrong", "[parallel][pipeline][split]") {
  CHECK_THROWS_WITH(balance_pipeline_stages(llm(4), {.layers = {1, 1, 1}}, 2),
                    Contains("expected one cost per layer module (4), got 3"));
  CHECK_THROWS_WITH(balance_pipeline_stages(llm(2), {.layers = {1, 1}}, 5),
                    Contains("expected between 1 and 4 stages (the input modules, 2 layers and the output modules"));
  CHECK_THROWS_WITH(balance_pipeline_stages(llm(2), {.layers = {1, -1}}, 2),
                    Contains("expected a finite cost >= 0 for every module, got -1 for layers.1"));
  // A flops split needs the blocks' FLOPs, and a given module list is not cut again.
  ParallelismConfig p{.pipeline_parallel_split = PipelineSplitBy::flops};
  CHECK_THROWS_WITH(parallel::pipeline_plan(llm(6), {}, 2, p), Contains("expected each of the 6 blocks' FLOPs"));
  // A pipeline part knows only its own blocks' FLOPs: its spec has none, and the planner says where to get them.
  const llama3::Llama3 part(llama3::flavor("debugmodel"), 32, at::TensorOptions().device(at::kMeta), {"layers.0"});
  CHECK_THROWS_WITH(parallel::plan(part.sharding_spec(), {.parallelism = p}, dist::MeshShape{.pp = 2}),
                    Contains("a model built whole, on meta, knows them"));
  JobConfig job;
  job.parallelism.pipeline_parallel_split = PipelineSplitBy::flops;
  job.parallelism.module_fqns_per_model_part = Parts{{"tok_embeddings", "layers.0"}, {"norm", "output"}};
  CHECK_THROWS_WITH(validate(job), Contains("expected parallelism.pipeline_parallel_split to be layers when "
                                            "module_fqns_per_model_part gives the stages"));
}

TEST_CASE("a Llama 3 split by FLOPs: stages within 5% of the mean, summing to num_flops_per_token",
          "[parallel][pipeline][split]") {
  llama3::Llama3Args args = llama3::flavor("debugmodel");
  args.n_layers = 15;  // 15 blocks + a head of about half a block (V 2048): 8, 4 and 2 stages all near-even
  const int64_t seq_len = 256;
  const auto whole = std::make_shared<llama3::Llama3>(args, seq_len, at::TensorOptions().device(at::kMeta));
  const PipelineModuleCosts costs = models::pipeline_costs(*whole, seq_len);
  const double head_share = costs.output / costs.layers[0];
  CHECK(head_share == Approx(0.53).margin(0.01));  // 6 V D against 6 (4 D^2 + 3 D F) + attention
  for (auto [schedule, pp] : {std::pair{PipelineSchedule::zbv_zero_bubble, 4},
                              {PipelineSchedule::schedule_1f1b, 4},
                              {PipelineSchedule::interleaved_1f1b, 2},
                              {PipelineSchedule::schedule_1f1b, 2}}) {
    const ParallelismConfig p{.pipeline_parallel_split = PipelineSplitBy::flops,
                              .pipeline_parallel_schedule = schedule};
    const Parts parts = split_of(args, seq_len, pp, p);
    const std::vector<double> stage = pipeline_stage_costs(llm(15), costs, parts);
    CHECK(std::accumulate(stage.begin(), stage.end(), 0.0) ==
          Approx(static_cast<double>(whole->num_flops_per_token(seq_len))));
    CHECK(max_of(stage) <= 1.05 * mean_of(stage));
  }
  // A vocabulary of 32768 makes the head 8.5 blocks: every block goes to stage 0, where torchtitan's
  // count puts 3 of the 6 blocks beside the head.
  llama3::Llama3Args wide = llama3::flavor("debugmodel");
  wide.vocab_size = 32768;
  const ParallelismConfig p{.pipeline_parallel_split = PipelineSplitBy::flops};
  const Parts parts = split_of(wide, seq_len, 2, p);
  CHECK(parts == Parts{{"tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "layers.4", "layers.5"},
                       {"norm", "output"}});
}

TEST_CASE("the default split is still torchtitan's", "[parallel][pipeline][split]") {
  // generate_llm_fqn_per_model_part(4, 8): effective 10 = 3,3,2,2.
  const ParallelismConfig p{.pipeline_parallel_schedule = PipelineSchedule::interleaved_1f1b};
  CHECK(p.pipeline_parallel_split == PipelineSplitBy::layers);
  CHECK(parallel::pipeline_plan(llm(8), {}, 2, p).stages == Parts{{"tok_embeddings", "layers.0", "layers.1"},
                                                                  {"layers.2", "layers.3", "layers.4"},
                                                                  {"layers.5", "layers.6"},
                                                                  {"layers.7", "norm", "output"}});
  // layers_per_stage 2 with 6 layers: (6 + 1 + 1) / 2 = 4 stages on 2 ranks.
  const ParallelismConfig per{.pipeline_parallel_layers_per_stage = 2,
                              .pipeline_parallel_schedule = PipelineSchedule::interleaved_1f1b};
  CHECK(split_of(llama3::flavor("debugmodel"), 32, 2, per) == Parts{{"tok_embeddings", "layers.0"},
                                                                    {"layers.1", "layers.2"},
                                                                    {"layers.3", "layers.4"},
                                                                    {"layers.5", "norm", "output"}});
}
