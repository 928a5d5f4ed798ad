// SPDX-License-Identifier: BSD-3-Clause
// Tests for core/config.hpp and core/config_loader.hpp: torchtitan defaults, layering, CLI forms,
// torchtitan v0.2.2 TOML compatibility, error messages, --help and the JSON round trip.
#include "test_util.hpp"

#include "titan/core/config.hpp"
#include "titan/core/config_loader.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace {

using Catch::Contains;
using titan::JobConfig;
namespace fs = std::filesystem;

// parse_args over {"prog", args...}.
JobConfig parse(std::vector<std::string> args, titan::ConfigNotes* notes = nullptr) {
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return titan::parse_args(static_cast<int>(argv.size()), argv.data(), notes);
}

// titan's copies of torchtitan v0.2.2's Llama 3 job files (same sections, keys and values).
fs::path torchtitan_toml(const std::string& name) { return titan::test::source_dir() / "configs" / (name + ".toml"); }

// Writes `text` to dir/name and returns the path.
std::string write(const titan::test::TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path path = dir.path / name;
  titan::test::write_file(path, text);
  return path.string();
}

std::string error_key(const std::function<void()>& f) {
  try {
    f();
  } catch (const titan::ConfigError& e) {
    return e.key();
  }
  return "<no ConfigError>";
}

}  // namespace

TEST_CASE("config defaults are torchtitan v0.2.2's", "[cpu][config]") {
  const JobConfig c;
  CHECK(c.job.dump_folder == "./outputs");
  CHECK_FALSE(c.job.config_file.has_value());
  CHECK(c.model.name == "llama3");
  CHECK(c.model.flavor == "debugmodel");
  CHECK(c.model.hf_assets_path == "./tests/assets/tokenizer");
  CHECK(c.metrics.log_freq == 10);
  CHECK(c.optimizer.lr == 8e-4);
  CHECK(c.optimizer.beta2 == 0.95);
  CHECK(c.optimizer.implementation == titan::OptimizerImplementation::fused);
  CHECK(c.lr_scheduler.warmup_steps == 200);
  CHECK_FALSE(c.lr_scheduler.total_steps.has_value());
  CHECK_FALSE(c.lr_scheduler.decay_ratio.has_value());
  CHECK(c.training.local_batch_size == 8);
  CHECK(c.training.global_batch_size == -1);
  CHECK(c.training.seq_len == 2048);
  CHECK(c.training.steps == 10000);
  CHECK(c.training.dataset == "c4_test");
  CHECK_FALSE(c.training.dataset_path.has_value());
  CHECK(c.training.dtype == titan::DType::float32);
  CHECK(c.parallelism.data_parallel_shard_degree == -1);
  CHECK(c.parallelism.context_parallel_load_balancer == titan::CpLoadBalancer::headtail);
  CHECK(c.checkpoint.interval == 500);
  CHECK(c.activation_checkpoint.selective_ac_option == "2");
  CHECK(c.activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns ==
        std::vector<std::string>{"moe.router.gate"});
  CHECK(c.compile.components == std::vector<std::string>{"model", "loss"});
  CHECK(c.validation.steps == -1);
  CHECK_FALSE(c.debug.seed.has_value());
  CHECK_NOTHROW(titan::validate(c));
}

TEST_CASE("for_each_field visits the declared fields in order", "[cpu][config]") {
  std::vector<std::string> sections;
  JobConfig c;
  for_each_field(c, [&](std::string_view name, auto&) { sections.emplace_back(name); });
  CHECK(sections == std::vector<std::string>{"job", "profiling", "metrics", "model", "optimizer", "lr_scheduler",
                                             "training", "parallelism", "checkpoint", "activation_checkpoint",
                                             "compile", "float8", "comm", "fault_tolerance", "validation", "eval",
                                             "debug", "lora"});
  // Writes go through the visitor's references.
  for_each_field(c.training, [](std::string_view name, auto& value) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(value)>, int64_t>) {
      if (name == "steps") value = 42;
    }
  });
  CHECK(c.training.steps == 42);
  const std::vector<std::string> keys = titan::config_keys();
  CHECK(keys.front() == "job.config_file");
  CHECK(std::count(keys.begin(), keys.end(), "training.dataloader.num_workers") == 1);
  CHECK(std::count(keys.begin(), keys.end(), "validation.dataloader.prefetch_factor") == 1);
}

TEST_CASE("layers apply in order: defaults < preset < TOML < command line", "[cpu][config]") {
  titan::test::TempDir dir;
  const std::string toml = write(dir, "run.toml", "[training]\nsteps = 20\n[metrics]\nlog_freq = 5\n");
  // The file is listed after the override on purpose: position on the line does not change the layer.
  const JobConfig c = parse({"--training.steps", "30", "--config", "llama3_debugmodel", "--job.config_file", toml});
  CHECK(c.training.steps == 30);            // command line beats TOML
  CHECK(c.metrics.log_freq == 5);           // TOML beats preset (1)
  CHECK(c.lr_scheduler.warmup_steps == 2);  // preset beats default (200)
  CHECK(c.training.seq_len == 2048);        // default survives
  CHECK(c.job.config_file == toml);
}

TEST_CASE("overrides accept key=value and key value forms and hyphens", "[cpu][config]") {
  const JobConfig c = parse({"--training.steps=7", "--training.seq_len", "128", "--optimizer.lr=3e-4",
                             "--job.dump-folder", "/tmp/run", "--parallelism.data_parallel_shard_degree", "-1"});
  CHECK(c.training.steps == 7);
  CHECK(c.training.seq_len == 128);
  CHECK(c.optimizer.lr == 3e-4);
  CHECK(c.job.dump_folder == "/tmp/run");
  CHECK(c.parallelism.data_parallel_shard_degree == -1);
}

TEST_CASE("boolean flags take tyro's forms", "[cpu][config]") {
  CHECK(parse({"--training.gc_debug"}).training.gc_debug);
  CHECK(parse({"--training.gc_debug", "true"}).training.gc_debug);
  CHECK_FALSE(parse({"--training.gc_debug", "false"}).training.gc_debug);
  CHECK(parse({"--training.gc_debug=True"}).training.gc_debug);
  CHECK_FALSE(parse({"--checkpoint.no_initial_load_model_only"}).checkpoint.initial_load_model_only);
  CHECK_FALSE(parse({"--metrics.no-enable-jsonl"}).metrics.enable_jsonl);
  // A bare flag does not swallow the next option.
  const JobConfig c = parse({"--training.gc_debug", "--training.steps", "3"});
  CHECK(c.training.gc_debug);
  CHECK(c.training.steps == 3);
  CHECK_THROWS_WITH(parse({"--training.gc_debug=maybe"}), Contains("training.gc_debug expects true or false"));
}

TEST_CASE("lists and optionals parse from the command line", "[cpu][config]") {
  const JobConfig c =
      parse({"--model.converters", "float8, mx", "--compile.components", "", "--parallelism.module_fqns_per_model_part",
             "tok_embeddings,layers.0;layers.1", "--checkpoint.exclude_from_loading", R"(["optimizer","dataloader"])",
             "--debug.seed", "42", "--lr_scheduler.decay_ratio", "0.5", "--training.dataset_path", "/data/c4"});
  CHECK(c.model.converters == std::vector<std::string>{"float8", "mx"});
  CHECK(c.compile.components.empty());
  REQUIRE(c.parallelism.module_fqns_per_model_part.has_value());
  CHECK(*c.parallelism.module_fqns_per_model_part ==
        std::vector<std::vector<std::string>>{{"tok_embeddings", "layers.0"}, {"layers.1"}});
  CHECK(c.checkpoint.exclude_from_loading == std::vector<std::string>{"optimizer", "dataloader"});
  CHECK(c.debug.seed == std::optional<int64_t>(42));
  CHECK(c.lr_scheduler.decay_ratio == std::optional<double>(0.5));
  CHECK(c.training.dataset_path == std::optional<std::string>("/data/c4"));
  CHECK_FALSE(parse({"--debug.seed", "1", "--debug.seed", "None"}).debug.seed.has_value());
}

TEST_CASE("torchtitan v0.2.2 TOML files load unchanged", "[cpu][config]") {
  titan::ConfigNotes debug_notes;
  const JobConfig debug = parse({"--job.config_file", torchtitan_toml("llama3_debugmodel").string()}, &debug_notes);
  CHECK(debug.model.flavor == "debugmodel");
  CHECK(debug.training.steps == 10);
  CHECK(debug.metrics.log_freq == 1);
  CHECK(debug.lr_scheduler.decay_ratio == std::optional<double>(0.8));
  CHECK(debug.parallelism.pipeline_parallel_schedule == titan::PipelineSchedule::interleaved_1f1b);
  CHECK(debug.float8.filter_fqns == std::vector<std::string>{"output"});  // from [quantize.linear.float8]
  // Selective AC every 2nd block works: nothing to note.
  CHECK(debug_notes.empty());

  const JobConfig b8 = parse({"--job.config_file", torchtitan_toml("llama3_8b").string()});
  CHECK(b8.model.flavor == "8B");
  CHECK(b8.optimizer.lr == 3e-4);
  CHECK(b8.training.seq_len == 8192);
  CHECK(b8.training.local_batch_size == 1);
  CHECK(b8.activation_checkpoint.selective_ac_option == "op");

  const JobConfig b70 = parse({"--job.config_file", torchtitan_toml("llama3_70b").string()});
  CHECK(b70.model.flavor == "70B");
  CHECK(b70.optimizer.lr == 1.5e-4);
  CHECK(b70.parallelism.tensor_parallel_degree == 8);
  CHECK(b70.activation_checkpoint.mode == titan::AcMode::full);

  titan::ConfigNotes notes;
  const JobConfig b405 = parse({"--job.config_file", torchtitan_toml("llama3_405b").string()}, &notes);
  CHECK(b405.model.flavor == "405B");
  CHECK(b405.lr_scheduler.warmup_steps == 600);
  CHECK(b405.model.converters == std::vector<std::string>{"float8"});
  CHECK(b405.float8.enable_fsdp_float8_all_gather);
  CHECK(b405.compile.enable);
  const std::string all = fmt::format("{}", fmt::join(notes, "\n"));
  CHECK_THAT(all, !Contains("float8.enable_fsdp_float8_all_gather"));  // float8 all-gather works: no note
  // TP and async TP work: no note for them.
  CHECK_THAT(all, !Contains("tensor_parallel"));
  CHECK_THAT(all, Contains("compile.enable"));
  CHECK_THAT(all, !Contains("activation_checkpoint"));  // full AC works
  CHECK_FALSE(notes.help_requested);
}

TEST_CASE("llama3 presets equal torchtitan's TOML files", "[cpu][config]") {
  for (const std::string name : {"llama3_debugmodel", "llama3_8b", "llama3_70b", "llama3_405b"}) {
    INFO(name);
    JobConfig from_preset;
    titan::apply_preset(from_preset, name);
    JobConfig from_toml;
    titan::apply_json(from_toml, titan::read_config_file(torchtitan_toml(name)), name);
    CHECK(titan::to_json(from_preset).dump(1) == titan::to_json(from_toml).dump(1));
  }
  JobConfig small;
  titan::apply_preset(small, "llama3_1b");
  CHECK(small.model.flavor == "1B");
  CHECK(small.training.seq_len == 8192);
}

TEST_CASE("users can register presets", "[cpu][config]") {
  titan::register_preset("test_tiny", [](JobConfig& c) {
    c.training.steps = 3;
    c.training.seq_len = 64;
  });
  const auto names = titan::preset_names();
  CHECK(std::count(names.begin(), names.end(), "test_tiny") == 1);
  const JobConfig c = parse({"--config=test_tiny", "--training.seq_len", "32"});
  CHECK(c.training.steps == 3);
  CHECK(c.training.seq_len == 32);
  CHECK_THROWS_WITH(parse({"--config", "llama3_9b"}), Contains("llama3_8b") && Contains("llama3_9b"));
  CHECK_THROWS_WITH(parse({"--config", "run.toml"}), Contains("--job.config_file"));
}

TEST_CASE("unknown keys name the key and suggest the closest", "[cpu][config]") {
  titan::test::TempDir dir;
  const std::string typo = write(dir, "run.toml", "[training]\nstep = 10\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", typo}),
                    Contains("unknown key 'training.step' in " + typo) && Contains("Did you mean 'training.steps'?"));
  CHECK(error_key([&] { parse({"--job.config_file", typo}); }) == "training.step");
  CHECK_THROWS_WITH(parse({"--training.step", "10"}),
                    Contains("unknown key 'training.step' in the command line") && Contains("'training.steps'"));
  CHECK_THROWS_WITH(parse({"--trainng.seq_len=10"}), Contains("Did you mean 'training.seq_len'?"));
  const std::string top = write(dir, "top.toml", "steps = 10\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", top}), Contains("Did you mean 'training.steps'?"));
  const std::string alias = write(dir, "alias.toml", "[quantize.linear.float8]\nfilter_fqn = [\"output\"]\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", alias}),
                    Contains("Did you mean 'quantize.linear.float8.filter_fqns'?"));
  const std::string table = write(dir, "table.toml", "[training]\ndataloader = 3\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", table}), Contains("training.dataloader is a table"));
  const std::string empty = write(dir, "empty.toml", "[nonsense]\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", empty}), Contains("unknown key 'nonsense'"));
  CHECK_THROWS_WITH(parse({"training.steps", "3"}), Contains("expected --section.key arguments"));
}

TEST_CASE("wrong types name the key and the expected type and the value", "[cpu][config]") {
  titan::test::TempDir dir;
  const std::string toml = write(dir, "run.toml", "[training]\nsteps = \"ten\"\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", toml}), Contains("training.steps expects an integer, got \"ten\""));
  CHECK_THROWS_WITH(parse({"--training.steps", "ten"}), Contains("training.steps expects an integer, got \"ten\""));
  CHECK_THROWS_WITH(parse({"--optimizer.lr", "fast"}), Contains("optimizer.lr expects a number"));
  const std::string list = write(dir, "list.toml", "[model]\nconverters = [1, 2]\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", list}), Contains("model.converters expects a list of strings"));
  const std::string fraction = write(dir, "fraction.toml", "[training]\nsteps = 1.5\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", fraction}), Contains("training.steps expects an integer, got 1.5"));
  CHECK(error_key([] { parse({"--training.seq_len", "x"}); }) == "training.seq_len");
}

TEST_CASE("file errors name the file and the position", "[cpu][config]") {
  titan::test::TempDir dir;
  const std::string bad = write(dir, "bad.toml", "[training]\nsteps = 1\nseq_len = = 2\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", bad}), Contains(bad) && Contains("line 3"));
  const std::string bad_json = write(dir, "bad.json", "{\"training\": {\"steps\": }");
  CHECK_THROWS_WITH(parse({"--job.config_file", bad_json}), Contains(bad_json));
  const std::string missing = (dir.path / "nope.toml").string();
  CHECK_THROWS_WITH(parse({"--job.config_file", missing}), Contains(missing));
  CHECK(error_key([&] { parse({"--job.config_file", missing}); }) == "job.config_file");
}

TEST_CASE("recognised torchtitan sections load with a note", "[cpu][config]") {
  titan::test::TempDir dir;
  const std::string toml = write(dir, "ft.toml",
                                 "[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n"
                                 "[experimental]\n");
  titan::ConfigNotes notes;
  CHECK_NOTHROW(parse({"--job.config_file", toml, "--memory_estimation.enable"}, &notes));
  const std::string all = fmt::format("{}", fmt::join(notes, "\n"));
  CHECK_THAT(all, Contains("quantize.grouped_mm.float8.fqns"));
  CHECK_THAT(all, Contains("memory_estimation.enable"));
  // A default value is no reason for a note; a non-default switch is.
  JobConfig c;
  c.activation_checkpoint.mode = titan::AcMode::none;
  CHECK(titan::unsupported_notes(c).empty());
  c.checkpoint.initial_load_in_hf_quantized = true;
  REQUIRE(titan::unsupported_notes(c).size() == 1);
  CHECK_THAT(titan::unsupported_notes(c)[0], Contains("checkpoint.initial_load_in_hf_quantized = true"));
}

TEST_CASE("the support table: no note for working features, one per noted key", "[cpu][config]") {
  // torchtitan's default (selective, every 2nd block) works: no note; nor does per-operator AC.
  titan::ConfigNotes defaults;
  parse({}, &defaults);
  CHECK(defaults.empty());
  titan::ConfigNotes per_op;
  parse({"--activation_checkpoint.selective_ac_option", "op"}, &per_op);
  CHECK(per_op.empty());
  // Notes are collected once, however many layers set the key.
  titan::ConfigNotes twice;
  parse({"--compile.enable", "--compile.enable"}, &twice);
  REQUIRE(twice.size() == 1);
  CHECK_THAT(twice[0], Contains("compile.enable = true"));
  // TP, async TP, loss parallel, PP, FSDP/HSDP/DDP options, checkpointing and TensorBoard work: no note.
  titan::ConfigNotes working;
  parse({"--activation_checkpoint.mode",
         "none",
         "--parallelism.tensor_parallel_degree",
         "2",
         "--parallelism.pipeline_parallel_degree",
         "2",
         "--parallelism.pipeline_parallel_schedule",
         "ZBVZeroBubble",
         "--parallelism.enable_async_tensor_parallel",
         "--parallelism.disable_loss_parallel",
         "--parallelism.data_parallel_replicate_degree",
         "2",
         "--parallelism.data_parallel_shard_degree",
         "2",
         "--parallelism.fsdp_reshard_after_forward",
         "always",
         "--parallelism.context_parallel_degree",
         "2",
         "--checkpoint.enable",
         "--checkpoint.async_mode",
         "async_with_pinned_mem",
         "--metrics.enable_tensorboard",
         "--metrics.save_for_all_ranks"},
        &working);
  CHECK(working.empty());
  // Expert tensor parallelism at tp works too; any other degree is refused naming the key and the fix.
  titan::ConfigNotes etp;
  parse({"--activation_checkpoint.mode", "none", "--parallelism.tensor_parallel_degree", "2",
         "--parallelism.expert_tensor_parallel_degree", "2"},
        &etp);
  CHECK(etp.empty());
  CHECK(error_key([] {
          parse({"--parallelism.tensor_parallel_degree", "2", "--parallelism.expert_tensor_parallel_degree", "4"});
        }) == "parallelism.expert_tensor_parallel_degree");
  CHECK_THROWS_WITH(parse({"--parallelism.expert_tensor_parallel_degree", "2"}),
                    Contains("expected parallelism.expert_tensor_parallel_degree to be 1 or tensor_parallel_degree "
                             "(1), got 2"));
}

TEST_CASE("validate names the offending key", "[cpu][config]") {
  JobConfig c;
  c.training.steps = 0;
  CHECK_THROWS_WITH(titan::validate(c), Contains("expected training.steps > 0, got 0"));
  CHECK_THROWS_WITH(parse({"--lr_scheduler.decay_type", "cos"}), Contains("linear|sqrt|cosine") && Contains("\"cos\""));
  CHECK_THROWS_WITH(parse({"--lr_scheduler.min_lr_factor", "1.5"}), Contains("lr_scheduler.min_lr_factor in [0, 1]"));
  CHECK_THROWS_WITH(parse({"--training.dtype", "float16"}),
                    Contains("training.dtype to be one of float32|bfloat16, got \"float16\""));
  CHECK_THROWS_WITH(parse({"--parallelism.fsdp_reshard_after_forward", "sometimes"}), Contains("default|always|never"));
  CHECK_THROWS_WITH(parse({"--activation_checkpoint.selective_ac_option", "x"}), Contains("selective_ac_option"));
  CHECK(error_key([] { parse({"--optimizer.lr", "-1"}); }) == "optimizer.lr");
  CHECK(error_key([] { parse({"--lr_scheduler.warmup_steps", "-1"}); }) == "lr_scheduler.warmup_steps");
  CHECK_THROWS_WITH(parse({"--comm.backend", "mpi"}), Contains("comm.backend to be auto, gloo, nccl or strict"));
  CHECK(parse({"--comm.backend", "strict"}).comm.backend == "strict");
  const std::vector<std::string> ft = {"--fault_tolerance.enable", "true", "--fault_tolerance.group_size", "2",
                                       "--fault_tolerance.process_group"};
  auto with = [&](const std::string& backend) {
    std::vector<std::string> args = ft;
    args.push_back(backend);
    return parse(args);
  };
  CHECK(with("strict").fault_tolerance.process_group == "strict");
  CHECK_THROWS_WITH(with("mpi"), Contains("fault_tolerance.process_group to be gloo, nccl or strict"));
}

TEST_CASE("optimizer.implementation fused_opt_states_bf16 needs training.dtype float32", "[cpu][config]") {
  const JobConfig c = parse({"--optimizer.implementation", "fused_opt_states_bf16"});
  CHECK(c.optimizer.implementation == titan::OptimizerImplementation::fused_opt_states_bf16);
  const std::vector<std::string> bf16 = {"--optimizer.implementation", "fused_opt_states_bf16", "--training.dtype",
                                         "bfloat16"};
  CHECK_THROWS_WITH(parse(bf16), Contains("[titan::config] expected training.dtype = \"float32\" with "
                                          "optimizer.implementation = \"fused_opt_states_bf16\"") &&
                                     Contains("got training.dtype = \"bfloat16\"") &&
                                     Contains("optimizer.implementation = \"fused\""));
  CHECK(error_key([&] { parse(bf16); }) == "optimizer.implementation");
  // bf16 parameters with the other implementations stay valid.
  CHECK_NOTHROW(parse({"--training.dtype", "bfloat16"}));
}

TEST_CASE("choices parse from every source by their names and print by format_as", "[cpu][config]") {
  titan::test::TempDir dir;
  const std::string toml =
      write(dir, "run.toml",
            "[checkpoint]\nasync_mode = \"async_with_pinned_mem\"\n[optimizer]\n"
            "implementation = \"for-loop\"\n[parallelism]\npipeline_parallel_schedule = \"GPipe\"\n");
  const JobConfig c = parse({"--job.config_file", toml, "--lr_scheduler.decay_type", "cosine",
                             "--training.dataset_format", "chat", "--optimizer.name=Adam"});
  CHECK(c.checkpoint.async_mode == titan::AsyncMode::async_with_pinned_mem);
  CHECK(c.optimizer.implementation == titan::OptimizerImplementation::for_loop);
  CHECK(c.parallelism.pipeline_parallel_schedule == titan::PipelineSchedule::gpipe);
  CHECK(c.lr_scheduler.decay_type == titan::DecayType::cosine);
  CHECK(c.training.dataset_format == titan::DatasetFormat::chat);
  CHECK(c.optimizer.name == titan::OptimizerName::adam);
  CHECK(fmt::format("{} {}", c.optimizer.implementation, titan::PipelineSchedule::schedule_1f1b) == "for-loop 1F1B");
  CHECK(titan::choice_list<titan::AsyncMode>() == "disabled|async|async_with_pinned_mem");
  // The JSON dump writes the names, and reads them back.
  const nlohmann::json j = titan::to_json(c);
  CHECK(j["checkpoint"]["async_mode"] == "async_with_pinned_mem");
  CHECK(j["parallelism"]["context_parallel_load_balancer"] == "headtail");
  CHECK(j["training"]["dataset_format"] == "chat");
  CHECK(titan::from_json(j).optimizer.implementation == titan::OptimizerImplementation::for_loop);
  CHECK_FALSE(
      parse({"--parallelism.context_parallel_load_balancer", "None"}).parallelism.context_parallel_load_balancer);
  // A bad value names the key, the value and the choices, from a file or the command line.
  const std::string bad = write(dir, "bad.toml", "[checkpoint]\nasync_mode = \"sometimes\"\n");
  CHECK_THROWS_WITH(
      parse({"--job.config_file", bad}),
      Contains("checkpoint.async_mode expects one of disabled|async|async_with_pinned_mem, got \"sometimes\""));
  CHECK(error_key([&] { parse({"--job.config_file", bad}); }) == "checkpoint.async_mode");
  const std::string number = write(dir, "number.toml", "[lr_scheduler]\ndecay_type = 1\n");
  CHECK_THROWS_WITH(parse({"--job.config_file", number}),
                    Contains("lr_scheduler.decay_type expects one of") && Contains("got 1"));
  CHECK_THROWS_WITH(parse({"--training.packing", "Concat"}),
                    Contains("training.packing expects one of concat|document|padded, got \"Concat\""));
  // --help lists the choices as the type.
  CHECK_THAT(titan::config_help(), Contains("--lr_scheduler.decay_type linear|sqrt|cosine (default: \"linear\")"));
  CHECK_THAT(titan::config_help(), Contains("--training.dataset_format text|jsonl|fortunes|chat|None (default: None)"));
}

TEST_CASE("help lists every key with its default and its doc line", "[cpu][config]") {
  const std::string help = titan::config_help();
  size_t leaves = 0;
  const JobConfig defaults;
  titan::detail::for_each_leaf(defaults, "",
                               [&](std::string_view, std::string_view, std::string_view, const auto&) { ++leaves; });
  size_t lines = 0;
  for (size_t pos = help.find("\n  --"); pos != std::string::npos; pos = help.find("\n  --", pos + 1)) ++lines;
  CHECK(lines == leaves);
  CHECK(titan::config_keys().size() == leaves);
  for (const std::string& key : titan::config_keys()) {
    INFO(key);
    CHECK_THAT(help, Contains("  --" + key + " "));
  }
  CHECK_THAT(help, Contains("--training.steps int (default: 10000)"));
  CHECK_THAT(help, Contains("--debug.seed int|None (default: None)"));
  CHECK_THAT(help, Contains("llama3_405b"));
  CHECK(help.find("(undocumented)") == std::string::npos);
  // The doc is the `///` line above the field in config.hpp, read back from the header itself.
  const std::string header = titan::test::read_file(titan::test::source_dir() / "include/titan/core/config.hpp");
  const size_t field = header.find("int64_t steps = 10000;");
  REQUIRE(field != std::string::npos);
  const size_t doc_begin = header.rfind("/// ", field) + 4;
  const std::string doc = header.substr(doc_begin, header.find('\n', doc_begin) - doc_begin);
  CHECK_THAT(help, Contains("(default: 10000)  " + doc));

  titan::ConfigNotes notes;
  parse({"--training.steps", "not-even-parsed", "--help"}, &notes);
  CHECK(notes.help_requested);
  CHECK(titan::help_requested(2, std::vector<const char*>{"prog", "-h"}.data()));
}

TEST_CASE("fault_tolerance keys are checked when it is on", "[cpu][config]") {
  JobConfig c;
  c.fault_tolerance.group_size = 0;  // torchtitan's default loads while off
  CHECK_NOTHROW(titan::validate(c));
  c.fault_tolerance.enable = true;
  CHECK(error_key([&] { titan::validate(c); }) == "fault_tolerance.group_size");
  c.fault_tolerance.group_size = 2;
  c.fault_tolerance.replica_id = 2;
  CHECK(error_key([&] { titan::validate(c); }) == "fault_tolerance.replica_id");
  c.fault_tolerance.replica_id = 1;
  c.fault_tolerance.min_replica_size = 3;
  CHECK(error_key([&] { titan::validate(c); }) == "fault_tolerance.min_replica_size");
  c.fault_tolerance.min_replica_size = 1;
  c.fault_tolerance.semi_sync_method = "diloco";
  CHECK_NOTHROW(titan::validate(c));
  c.fault_tolerance.semi_sync_method.reset();
  CHECK_NOTHROW(titan::validate(c));
}

TEST_CASE("fault_tolerance semi-sync keys: local_sgd and diloco pass, what is not built names its key",
          "[cpu][config]") {
  JobConfig c;
  c.fault_tolerance.semi_sync_method = "diloco";
  CHECK(error_key([&] { titan::validate(c); }) == "fault_tolerance.semi_sync_method");  // needs enable
  c.fault_tolerance.enable = true;
  c.fault_tolerance.group_size = 2;
  CHECK_NOTHROW(titan::validate(c));
  c.fault_tolerance.semi_sync_method = "local_sgd";
  CHECK_NOTHROW(titan::validate(c));
  c.fault_tolerance.semi_sync_method = "async";
  CHECK(error_key([&] { titan::validate(c); }) == "fault_tolerance.semi_sync_method");
  c.fault_tolerance.semi_sync_method = "diloco";
  const auto refused = [&](auto edit, const std::string& key) {
    JobConfig bad = c;
    edit(bad.fault_tolerance);
    CHECK(error_key([&] { titan::validate(bad); }) == key);
  };
  refused([](auto& ft) { ft.sync_steps = 0; }, "fault_tolerance.sync_steps");
  refused([](auto& ft) { ft.should_quantize = true; }, "fault_tolerance.should_quantize");
  refused([](auto& ft) { ft.num_fragments = 2; }, "fault_tolerance.num_fragments");
  refused([](auto& ft) { ft.fragment_sync_delay = 1; }, "fault_tolerance.fragment_sync_delay");
  refused([](auto& ft) { ft.fragment_update_alpha = 1.5; }, "fault_tolerance.fragment_update_alpha");
  refused([](auto& ft) { ft.outer_lr = 0; }, "fault_tolerance.outer_lr");
  refused([](auto& ft) { ft.outer_momentum = 1; }, "fault_tolerance.outer_momentum");
  refused([](auto& ft) { ft.outer_momentum = 0; }, "fault_tolerance.outer_nesterov");
  refused(
      [](auto& ft) {
        ft.semi_sync_method = "local_sgd";
        ft.fragment_update_alpha = 0.5;
      },
      "fault_tolerance.fragment_update_alpha");
}

TEST_CASE("JSON round trip and the atomic config dump", "[cpu][config]") {
  JobConfig c;
  titan::apply_preset(c, "llama3_405b");
  c.debug.seed = 7;
  c.parallelism.module_fqns_per_model_part = {{"tok_embeddings"}, {"layers.0", "norm"}};
  c.lr_scheduler.decay_ratio = 0.25;
  const nlohmann::json j = titan::to_json(c);
  CHECK(j.size() == 18);  // one member per section
  CHECK(j["training"]["dataloader"]["num_workers"] == 0);
  CHECK(nlohmann::json(titan::to_json(JobConfig{}))["debug"]["seed"].is_null());
  CHECK(titan::to_json(titan::from_json(j)).dump() == j.dump());
  CHECK(titan::to_json(titan::from_json(j)).dump() != titan::to_json(JobConfig{}).dump());

  titan::test::TempDir dir;
  const fs::path file = dir.path / "run" / "config.json";
  titan::write_config_json(c, file);
  CHECK(std::distance(fs::directory_iterator(file.parent_path()), fs::directory_iterator()) == 1);
  const JobConfig loaded = parse({"--job.config_file", file.string()});
  nlohmann::json expected = j;
  expected["job"]["config_file"] = file.string();
  CHECK(titan::to_json(loaded).dump() == expected.dump());
}
