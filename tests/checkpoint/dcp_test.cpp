// SPDX-License-Identifier: BSD-3-Clause
// torchtitan's checkpoints (torch.distributed.checkpoint) in and out of titan, against torchtitan 0.2.2 itself
// (tests/oracles/torchtitan_dcp.py): its Llama 3 / Qwen3 debug model trains 3 steps and saves with its own
// CheckpointManager, `titan-convert from-dcp` makes a titan checkpoint of it, and titan resuming from that gives the
// losses of torchtitan resuming from its own checkpoint; `titan-convert to-dcp` of the converted checkpoint loads back
// in torchtitan item for item equal to its original, and torchtitan's CheckpointManager resumes from it. Metadata
// naming any class DCP's does not hold is refused by name.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "test_util.hpp"
#include "titan/checkpoint/dcp.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/data/dataloader.hpp"
#include "titan/data/tokenizer.hpp"
#include "titan/models/llama3/model.hpp"
#include "titan/models/qwen3/model.hpp"
#include "titan/train/data_setup.hpp"
#include "titan/train/trainer.hpp"
#include "tool_run.hpp"
#include "train/train_test_util.hpp"

// Its own namespace: the build compiles sources in batches, where file-local names must not meet.
namespace dcp_test {

using namespace titan;
using namespace std::string_literals;
namespace fs = std::filesystem;

constexpr int64_t kBefore = 3;  // torchtitan's steps before its checkpoint
constexpr int64_t kAfter = 2;   // steps after it, on both sides

// Both sides' run: the debug model on tinyshakespeare windows (batch 2 of 16 tokens), AdamW with torchtitan's
// defaults but foreach (what the oracle's torchtitan uses), 2 warmup steps of a linear schedule over 5 steps.
JobConfig resume_job(const std::string& model, const fs::path& dump) {
  JobConfig c = test::tinyshakespeare_job(dump, /*seq_len=*/16, /*local_batch=*/2, kBefore + kAfter, /*seed=*/3);
  c.model.name = model;
  c.optimizer.lr = 1e-3;
  c.optimizer.implementation = OptimizerImplementation::foreach;
  c.lr_scheduler.warmup_steps = 2;
  c.activation_checkpoint.mode = AcMode::none;
  c.metrics.disable_color_printing = true;
  return c;
}

// The windows titan's loader gives a fresh run of `c` (what a run resuming without torchtitan's loader state reads),
// for torchtitan to train on: input and labels (T, B, S), and the settings both sides share.
void write_batches(const JobConfig& c, const fs::path& file) {
  const auto tokenizer = data::load_tokenizer(c.model.hf_assets_path);
  const auto loader = build_dataloader(c, tokenizer, 0, 1);
  std::vector<at::Tensor> inputs, labels;
  for (int64_t i = 0; i < std::max(kBefore, kAfter); ++i) {
    const data::Batch b = loader->next();
    inputs.push_back(b.input);  // (B, S)
    labels.push_back(b.labels);
  }
  const nlohmann::json settings = {{"vocab", tokenizer->vocab_size()},
                                   {"seq_len", c.training.seq_len},
                                   {"lr", c.optimizer.lr},
                                   {"warmup_steps", c.lr_scheduler.warmup_steps},
                                   {"steps", c.training.steps},
                                   {"max_norm", c.training.max_norm}};
  checkpoint::write_safetensors(file, {{"input", at::stack(inputs)}, {"labels", at::stack(labels)}},
                                {{"settings", settings.dump()}});
}

template <typename Model>
void resumes_as_torchtitan(const std::string& model) {
  test::TempDir dir;
  const JobConfig straight = resume_job(model, dir.path / "unused");
  write_batches(straight, dir.path / "batches.safetensors");
  const fs::path torchtitan = dir.path / "torchtitan";
  REQUIRE(test::run_python("torchtitan_dcp.py",
                           fmt::format("train {} '{}' '{}' {} {}", model, (dir.path / "batches.safetensors").string(),
                                       torchtitan.string(), kBefore, kAfter)) == 0);
  const fs::path original = torchtitan / "checkpoint" / fmt::format("step-{}", kBefore);
  const fs::path converted = dir.path / "titan" / fmt::format("step-{}", kBefore);
  const auto from =
      test::run_tool("titan-convert", {"from-dcp", "--input", original.string(), "--output", converted.string(),
                                       "--model.name", model, "--model.flavor", "debugmodel"});
  REQUIRE(from.code == 0);

  // titan resumes from the converted checkpoint: step 4 onwards, with torchtitan's weights, moments and schedule.
  JobConfig c = resume_job(model, dir.path / "run");
  c.checkpoint.enable = true;
  c.checkpoint.initial_load_path = converted.string();
  c.checkpoint.initial_load_model_only = false;
  Trainer<Model> trainer(c);
  trainer.train();
  const std::vector<double>& got = trainer.core().loss_history();
  const nlohmann::json losses = nlohmann::json::parse(test::read_file(torchtitan / "losses.json"));
  const auto want = losses.at("after").get<std::vector<double>>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(fmt::format("step {}: titan {:.9g}, torchtitan {:.9g}, relative difference {:.2e}", kBefore + 1 + i, got[i],
                     want[i], std::abs(got[i] - want[i]) / std::abs(want[i])));
    // The same fp32 model, state and tokens on both sides: they differ by summation order inside GEMMs and
    // reductions (~1e-7 relative each), compounded over a forward, a backward and an AdamW step; 1e-5 relative
    // is the bound titan's own resharded resumes are held to. A wrong row order or moment would be off by far more.
    CHECK(std::abs(got[i] - want[i]) <= 1e-5 * std::abs(want[i]));
  }
  // Sanity: resuming mattered (a fresh model's loss at step 4 is near ln(vocab) = 7.6).
  CHECK(want[0] < losses.at("before").get<std::vector<double>>()[0] - 0.5);

  // Back out: titan's checkpoint as DCP equals torchtitan's item for item, and torchtitan resumes from it.
  const fs::path back = dir.path / "back" / "checkpoint" / fmt::format("step-{}", kBefore);
  const auto to = test::run_tool("titan-convert", {"to-dcp",
                                                   "--input",
                                                   converted.string(),
                                                   "--output",
                                                   back.string(),
                                                   "--model.name",
                                                   model,
                                                   "--model.flavor",
                                                   "debugmodel",
                                                   "--optimizer.lr",
                                                   "0.001",
                                                   "--optimizer.implementation",
                                                   "foreach",
                                                   "--lr_scheduler.warmup_steps",
                                                   "2",
                                                   "--training.steps",
                                                   "5",
                                                   "--training.local_batch_size",
                                                   "2",
                                                   "--training.seq_len",
                                                   "16"});
  REQUIRE(to.code == 0);
  const fs::path report = dir.path / "check.json";
  REQUIRE(test::run_python(
              "torchtitan_dcp.py",
              fmt::format("check {} '{}' '{}' '{}' '{}'", model, original.string(), (dir.path / "back").string(),
                          (dir.path / "batches.safetensors").string(), report.string())) == 0);
  const nlohmann::json check = nlohmann::json::parse(test::read_file(report));
  INFO(check.dump());
  CHECK(check.at("items").get<int64_t>() > 100);
  CHECK(check.at("missing").empty());
  CHECK(check.at("different").empty());
  CHECK(check.at("step") == kBefore);
  CHECK(check.at("last_epoch") == kBefore);
}

// Slow tier: Qwen3's case below runs the same conversion both ways, with its q/k row permutation on top.
TEST_CASE("torchtitan's Llama 3 checkpoint resumes in titan with torchtitan's losses and converts back exactly",
          "[checkpoint][torchtitan][slow]") {
  resumes_as_torchtitan<llama3::Llama3>("llama3");
}

TEST_CASE("torchtitan's Qwen3 checkpoint resumes in titan with torchtitan's losses and converts back exactly",
          "[checkpoint][torchtitan]") {
  resumes_as_torchtitan<qwen3::Qwen3>("qwen3");
}

TEST_CASE("a DCP checkpoint saved by two ranks (FSDP rows, TP columns, uneven shards) reads back whole",
          "[checkpoint][torchtitan]") {
  test::TempDir dir;
  REQUIRE(test::run_python("dcp_sharded.py", fmt::format("'{}'", (dir.path / "dcp").string())) == 0);
  const checkpoint::DcpReader dcp(dir.path / "dcp");
  const std::map<std::string, std::vector<int64_t>> shapes = {{"rows", {6, 4}}, {"cols", {3, 5}}, {"both", {5, 6}}};
  REQUIRE(dcp.tensors().size() == shapes.size());
  for (const auto& [key, shape] : shapes) {
    INFO(key);
    const at::Tensor t = dcp.read_tensor(key);  // whole, from both ranks' chunks
    CHECK(at::equal(t, at::arange(shape[0] * shape[1], at::kFloat).reshape(shape)));
  }
  CHECK(dcp.read_object("step")->integer == 7);
}

// A .metadata of `pickle` bytes in a fresh folder; the error DcpReader gives for it.
std::string metadata_error(const std::string& pickle) {
  test::TempDir dir;
  test::write_file(dir.path / ".metadata", pickle);
  return test::error_of([&] { checkpoint::DcpReader reader(dir.path); });
}

TEST_CASE("DCP metadata naming a class outside DCP's own, or malformed, is refused by name", "[checkpoint]") {
  // pickle.dumps of os.system("ls"), protocol 2: a GLOBAL the metadata never holds.
  const std::string os_system =
      "\x80\x02"
      "cos\nsystem\nX\x02\x00\x00\x00lsq\x00\x85R."s;
  CHECK_THAT(metadata_error(os_system), Catch::Contains("GLOBAL 'os.system' (refused by name)") &&
                                            Catch::Contains("[titan::checkpoint::unpickle] expected a class of the"));
  // The same by STACK_GLOBAL (protocol 4), and a lookalike in DCP's own module.
  const std::string stack_global =
      "\x80\x04\x8c\x08"
      "builtins\x8c\x04"
      "eval\x93)R."s;
  CHECK_THAT(metadata_error(stack_global), Catch::Contains("GLOBAL 'builtins.eval'"));
  const std::string lookalike =
      "\x80\x02"
      "ctorch.distributed.checkpoint.metadata\nPickler\n)R."s;
  CHECK_THAT(metadata_error(lookalike), Catch::Contains("GLOBAL 'torch.distributed.checkpoint.metadata.Pickler'"));
  // Truncated, and a valid pickle of something else.
  CHECK_THAT(metadata_error("\x80\x02}q\x00(X\x05\x00\x00"s), Catch::Contains("more bytes"));
  CHECK_THAT(metadata_error("\x80\x02K\x07."s),
             Catch::Contains("expected a torch.distributed.checkpoint.metadata.Metadata object at the top level") &&
                 Catch::Contains("got int 7"));
  // No metadata at all.
  test::TempDir empty;
  CHECK_THAT(test::error_of([&] { checkpoint::DcpReader reader(empty.path); }),
             Catch::Contains("expected a torch.distributed.checkpoint folder with .metadata"));
}

}  // namespace dcp_test
