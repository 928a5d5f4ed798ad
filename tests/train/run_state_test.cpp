// SPDX-License-Identifier: BSD-3-Clause
// The run state (train/run_state.hpp): the bf16 GEMM kernel a run's CPU forwards read is written to
// run_state.json and to each checkpoint's train_state, and a resume that runs the other kernel says so,
// naming both. Through the bundled trainer as processes, TITAN_BF16_GEMM setting the kernel of each.
#include <nlohmann/json.hpp>

#include "dist/launch_test_util.hpp"
#include "nn/bf16_gemm_scope.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/train/run_state.hpp"

namespace titan::test {
namespace {

nlohmann::json json_file(const fs::path& file) { return nlohmann::json::parse(read_file(file)); }

JobConfig bf16_cpu_job() {
  JobConfig config;
  config.training.mixed_precision_param = DType::bfloat16;
  return config;
}

}  // namespace

TEST_CASE("run state: which jobs read the bf16 GEMM choice and run_state.json records it", "[train][run_state]") {
  const at::Device cpu(at::kCPU);
  JobConfig fp32;
  JobConfig float8 = bf16_cpu_job();
  float8.model.converters = {"float8"};
  JobConfig bf16_params;
  bf16_params.training.dtype = DType::bfloat16;
  CHECK(runs_bf16_gemms(bf16_cpu_job(), cpu));
  CHECK(runs_bf16_gemms(bf16_params, cpu));
  CHECK_FALSE(runs_bf16_gemms(fp32, cpu));
  CHECK_FALSE(runs_bf16_gemms(float8, cpu));  // float8's CPU GEMMs are fp32
  CHECK_FALSE(current_run_state(fp32, cpu).bf16_gemm.has_value());

  dist::Mesh mesh;
  for (const auto choice : {nn::Bf16Gemm::native, nn::Bf16Gemm::widened}) {
    const Bf16GemmScope scope(choice);
    const TempDir run;
    const RunState settled = settle_run_state(bf16_cpu_job(), cpu, mesh.group("world"), run.path);
    REQUIRE(settled.bf16_gemm == choice);
    const nlohmann::json record = json_file(run.path / "run_state.json");
    const std::string name = choice == nn::Bf16Gemm::native ? "native" : "widened";
    CHECK(record.at("bf16_gemm") == name);
    CHECK_THAT(record.at("bf16_gemm_why").get<std::string>(), Catch::Contains("bf16 GEMMs on CPU"));
    CHECK(run_state_json(current_run_state(bf16_cpu_job(), cpu)) == nlohmann::json{{"bf16_gemm", name}});
  }
  const TempDir run;
  CHECK_FALSE(settle_run_state(fp32, cpu, mesh.group("world"), run.path).bf16_gemm.has_value());
  CHECK(json_file(run.path / "run_state.json").at("bf16_gemm").is_null());
}

TEST_CASE("run state: a checkpoint's other bf16 GEMM kernel is named on resume and the same one is not",
          "[train][run_state]") {
  const RunState native{.bf16_gemm = nn::Bf16Gemm::native};
  const RunState widened{.bf16_gemm = nn::Bf16Gemm::widened};
  const auto change = run_state_change({{"step", 4}, {"bf16_gemm", "widened"}}, native);
  REQUIRE(change.has_value());
  CHECK_THAT(*change, Catch::Contains("'widened'") && Catch::Contains("ATen's bf16 kernel (native)") &&
                          Catch::Contains("TITAN_BF16_GEMM=widened"));
  CHECK_THAT(run_state_change({{"bf16_gemm", "native"}}, widened).value_or(""),
             Catch::Contains("'native'") && Catch::Contains("widened fp32 GEMMs (widened)"));
  CHECK_FALSE(run_state_change({{"bf16_gemm", "widened"}}, widened).has_value());
  CHECK_FALSE(run_state_change({{"step", 4}}, native).has_value());                   // an older checkpoint
  CHECK_FALSE(run_state_change({{"bf16_gemm", nullptr}}, native).has_value());        // it ran no bf16 GEMMs
  CHECK_FALSE(run_state_change({{"bf16_gemm", "widened"}}, RunState{}).has_value());  // this run runs none
}

TEST_CASE(
    "run state: the trainer records the bf16 GEMM kernel in run_state.json and the checkpoint and a resume "
    "on the other kernel warns naming both",
    "[train][run_state][checkpoint][full]") {
  const TempDir dump;
  const std::vector<std::string> job = {"--training.mixed_precision_param",
                                        "bfloat16",
                                        "--checkpoint.enable",
                                        "true",
                                        "--checkpoint.interval",
                                        "1",
                                        "--checkpoint.last_save_model_only",
                                        "false",
                                        "--checkpoint.keep_latest_k",
                                        "0"};
  auto train = [&](int64_t steps, const std::string& kernel) {
    Subprocess run(concat(debug_trainer(dump.path, steps, 2), job), {{"RANK", std::nullopt},
                                                                     {"WORLD_SIZE", std::nullopt},
                                                                     {"TITAN_LOG_LEVEL", "info"},
                                                                     {"TITAN_BF16_GEMM", kernel}});
    require_exit(run, 0, 600);
    return run.output();
  };
  const std::string kWarning = "The checkpoint was trained with bf16 GEMMs on CPU as 'widened'";
  train(1, "widened");
  CHECK(json_file(dump.path / "run_state.json").at("bf16_gemm") == "widened");
  const fs::path step1 = dump.path / "checkpoint" / "step-1" / "index.json";
  CHECK(json_file(step1).at("values").at("train_state").at("bf16_gemm") == "widened");

  const std::string same = train(2, "widened");
  CHECK_THAT(same, Catch::Contains("Resuming at step 2"));
  CHECK_THAT(same, !Catch::Contains(kWarning));

  const std::string other = train(3, "native");
  CHECK_THAT(other, Catch::Contains("Resuming at step 3"));
  CHECK_THAT(other, Catch::Contains(kWarning) && Catch::Contains("this run runs ATen's bf16 kernel (native)"));
  CHECK(json_file(dump.path / "run_state.json").at("bf16_gemm") == "native");
  CHECK(json_file(dump.path / "checkpoint" / "step-3" / "index.json").at("values").at("train_state").at("bf16_gemm") ==
        "native");
}

}  // namespace titan::test
