// SPDX-License-Identifier: BSD-3-Clause
// titan-plan: what one rank of a job of any registered family (llama3, qwen3, deepseek_v3, gpt_oss; dense
// or MoE) holds (parameters, gradients, optimizer state, activations, communication buffers), the
// caching allocator's reserved peak against the device memory, and the step time from a cost model
// (compute plus the communication the layout cannot hide, EP's all-to-alls included), from the job's plan
// applied to the model built on the meta device: nothing is allocated. With --search, the layouts of --gpus
// devices that fit (expert parallelism included for an MoE model), fastest first. See docs/memory_planner.md.
//   titan-plan --config llama3_70b --gpus 256 --parallelism.tensor_parallel_degree 8 --device-memory H100
//   titan-plan --config llama3_405b --search --gpus 512 --device-memory 80GB --emit-config best.toml
//   titan-plan --model.name deepseek_v3 --model.flavor 671B --gpus 512 --parallelism.expert_parallel_degree 64
// Every other flag is a config key, as the trainer takes it (--job.config_file, --section.key value; a declared
// metrics.peak_flops is the device's peak).
#include <fmt/format.h>

#include <cctype>
#include <string>
#include <vector>

#include "titan/checkpoint/safetensors.hpp"
#include "titan/core/error.hpp"
#include "titan/core/log.hpp"
#include "titan/core/tool_args.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/models/decoder.hpp"
#include "titan/planner/memory_plan.hpp"

namespace {

const titan::ToolSpec kSpec = {
    .name = "titan-plan",
    .usage =
        "usage: titan-plan [--config PRESET] [--job.config_file FILE] [--section.key VALUE ...]\n"
        "                  [--gpus N] [--gpu NAME] [--device-memory 80GB|H100] [--mfu 40%]\n"
        "                  [--gpus-per-node 8] [--intra-node-bw 450GB] [--inter-node-bw 50GB] [--cpu]\n"
        "                  [--search [--limit N] [--hold tp,pp,...]] [--json] [--emit-config FILE]\n"
        "The model and the layout are the trainer's keys: --model.name llama3|qwen3|deepseek_v3|gpt_oss,\n"
        "--model.flavor, --parallelism.data_parallel_shard_degree, tensor_parallel_degree, ...\n",
    .flags =
        {{.name = "--gpus", .value = "N", .help = "devices in the job (default: the product of the parallel degrees)"},
         {.name = "--gpu", .value = "NAME", .help = "the GPU (H100, H200, B200, ...): its memory and peak FLOP/s"},
         {.name = "--device-memory",
          .value = "M",
          .help = "memory per device: a size (80GB, 80GiB) or a GPU name (H100, H200, B200, ...)"},
         {.name = "--mfu",
          .value = "X",
          .help = "fraction of peak the compute reaches, recompute included (default: calibrated on "
                  "torchtitan's published H100 runs, with torch.compile and float8 if on)"},
         {.name = "--gpus-per-node", .value = "N", .help = "GPUs per node on NVLink (default 8)"},
         {.name = "--intra-node-bw",
          .value = "B",
          .help = "bytes/s a GPU sends inside a node (default 450GB: NVLink 4 one way)"},
         {.name = "--inter-node-bw",
          .value = "B",
          .help = "bytes/s a GPU sends between nodes (default 50GB: 400 Gb/s RDMA per GPU)"},
         {.name = "--cpu", .help = "plan a CPU run (fp32 compute, CPU kernels) instead of a GPU run"},
         {.name = "--search", .help = "list the layouts of --gpus devices that fit --device-memory, fastest first"},
         {.name = "--limit", .value = "N", .help = "--search: list at most N layouts"},
         {.name = "--hold",
          .value = "A,B",
          .help = "--search: keep these of the config as they are: dp_shard, tp, pp, cp, ep, ac, microbatch"},
         {.name = "--json", .help = "print the plan (or the search) as JSON"},
         {.name = "--emit-config",
          .value = "FILE",
          .help = "write the plan's (the search's best) layout as a TOML overlay for --job.config_file"}},
    .renamed = {{.flag = "--peak-flops", .instead = "--metrics.peak_flops F (peak dense FLOP/s of one device)"}},
    .keys =
        "every key the trainer's plan depends on (model.*, parallelism.*, training.*, activation_checkpoint.*, "
        "float8.*, optimizer.implementation, ...); metrics.peak_flops (default: the GPU's from the table, else "
        "H100's)"};

struct Flags {
  titan::planner::PlanOptions plan{};
  titan::planner::SearchOptions search{};
  bool do_search = false;
  bool json = false;
  std::string emit_config{};
  std::string device = "H100";  // the GPU whose peak FLOP/s the step time uses
};

double parse_fraction(const std::string& text) {
  const bool percent = text.ends_with('%');
  double v = -1;
  try {
    v = std::stod(percent ? text.substr(0, text.size() - 1) : text);
  } catch (const std::exception&) {
    v = -1;
  }
  if (percent || v > 1) v /= 100;
  TITAN_CHECK_VALUE(v > 0 && v <= 1, "[titan-plan] expected --mfu in (0, 100%] (0.4 or 40%), got '{}'.", text);
  return v;
}

// "450GB" or "450e9" (bytes/s); "400Gb" is bits. Zero or less is an error.
double parse_bandwidth(const std::string& flag, const std::string& text) {
  double v = 0;
  try {
    size_t end = 0;
    v = std::stod(text, &end);
    const std::string unit = text.substr(end);
    if (unit == "GB" || unit == "GB/s")
      v *= 1e9;
    else if (unit == "Gb" || unit == "Gb/s" || unit == "Gbps")
      v *= 1e9 / 8;
    else if (unit == "TB" || unit == "TB/s")
      v *= 1e12;
    else if (!unit.empty())
      v = 0;
  } catch (const std::exception&) {
    v = 0;
  }
  TITAN_CHECK_VALUE(v > 0, "[titan-plan] expected {} as a bandwidth > 0 (450GB, 400Gb or 450e9 bytes/s), got '{}'.",
                    flag, text);
  return v;
}

int64_t count(const titan::ToolArgs& args, std::string_view flag, int64_t fallback) {
  const int64_t v = args.integer(flag, fallback);
  TITAN_CHECK_VALUE(v >= 1, "[titan-plan] expected {} to be an integer >= 1, got {}.", flag, v);
  return v;
}

// Memory per device: a size, or a GPU name for its memory (then also the GPU whose peak the step time uses).
void set_device_memory(Flags& f, const std::string& text) {
  if (auto bytes = titan::gpu_memory_bytes(text)) {
    f.plan.device_memory = *bytes;
    f.device = text;
    return;
  }
  // A word that is no size is meant as a GPU name: say so rather than "not a size".
  TITAN_CHECK_VALUE(text.empty() || !std::isalpha(static_cast<unsigned char>(text[0])),
                    "[titan-plan] expected --device-memory as a size (80GB, 80GiB) or a known GPU name "
                    "(H100, H200, B200, A100, MI300X, ...), got '{}': unknown GPU name.",
                    text);
  f.plan.device_memory = titan::parse_memory_size(text, "--device-memory");
}

Flags flags_of(const titan::ToolArgs& args) {
  Flags f;
  f.do_search = args.has("--search");
  f.json = args.has("--json");
  f.emit_config = args.value("--emit-config").value_or("");
  f.plan.gpus_per_node = count(args, "--gpus-per-node", f.plan.gpus_per_node);
  if (const auto bw = args.value("--intra-node-bw")) f.plan.intra_node_bw = parse_bandwidth("--intra-node-bw", *bw);
  if (const auto bw = args.value("--inter-node-bw")) f.plan.inter_node_bw = parse_bandwidth("--inter-node-bw", *bw);
  if (const auto gpu = args.value("--gpu")) {
    const auto bytes = titan::gpu_memory_bytes(*gpu);
    TITAN_CHECK_VALUE(bytes.has_value() && titan::gpu_peak_flops(*gpu).has_value(),
                      "[titan-plan] expected --gpu to name a GPU of the peak table (H100, H200, B200, A100, "
                      "MI300X, ...), got '{}'. Pass --device-memory and --metrics.peak_flops for another device.",
                      *gpu);
    f.plan.device_memory = *bytes;
    f.device = *gpu;
  }
  if (const auto memory = args.value("--device-memory")) set_device_memory(f, *memory);
  f.plan.gpu = !args.has("--cpu");
  if (args.has("--gpus")) f.plan.world_size = count(args, "--gpus", 1);
  for (const std::string& text : args.values("--hold")) {
    for (size_t start = 0; start <= text.size();) {
      const size_t comma = std::min(text.find(',', start), text.size());
      f.search.hold.push_back(text.substr(start, comma - start));
      start = comma + 1;
    }
  }
  f.search.limit = count(args, "--limit", f.search.limit);
  if (const auto mfu = args.value("--mfu")) f.plan.mfu = parse_fraction(*mfu);
  const double declared = args.config.metrics.peak_flops;
  TITAN_CHECK_VALUE(declared >= 0, "[titan-plan] expected metrics.peak_flops >= 0 (FLOP/s, 0 = the GPU's), got {}.",
                    declared);
  f.plan.peak_flops = declared > 0 ? declared : titan::gpu_peak_flops(f.device).value_or(989e12);
  f.search.gpus = f.plan.world_size;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  return titan::run_tool(kSpec, argc, argv, [&](const titan::ToolArgs& args) {
    const Flags flags = flags_of(args);
    const titan::JobConfig& config = args.config;
    TITAN_CHECK_VALUE(!flags.do_search || flags.plan.world_size > 0,
                      "[titan-plan] expected --gpus N with --search, got none. Say how many devices to fill.");
    titan::planner::MemoryPlanner planner(config);  // model.name's family on the meta device: no memory
    auto emit = [&](const titan::planner::MemoryPlan& plan) {
      if (flags.emit_config.empty()) return;
      // Temp file + rename: a job file read by a trainer is never half-written.
      titan::checkpoint::write_file_atomically(flags.emit_config, titan::planner::plan_toml(plan));
    };
    if (flags.json) {
      if (flags.do_search) {
        const auto plans = planner.search(config, flags.plan, flags.search);
        std::string out = "[";
        for (size_t i = 0; i < plans.size(); ++i) out += (i ? ",\n " : "") + titan::planner::plan_json(plans[i]);
        fmt::print("{}]\n", out);
        if (!plans.empty()) emit(plans.front());
        return plans.empty() ? 2 : 0;
      }
      const auto plan = planner.plan(config, flags.plan);
      fmt::print("{}\n", titan::planner::plan_json(plan));
      emit(plan);
      return plan.fits() ? 0 : 2;
    }
    const titan::models::DecoderShape& shape = planner.model().shape();
    const std::string moe = shape.moe_num_experts > 0
                                ? fmt::format(", {} MoE layers of {} experts (top {})", shape.moe_layers.size(),
                                              shape.moe_num_experts, shape.moe_top_k)
                                : std::string();
    fmt::print("model         {} {} ({} parameters{}), seq_len {}, local batch {}, {}\n", config.model.name,
               config.model.flavor, planner.model().num_params(), moe, config.training.seq_len,
               config.training.local_batch_size,
               flags.plan.gpu
                   ? fmt::format("GPU run ({} mixed precision)",
                                 titan::choice_name(titan::mixed_precision_param(config.training, /*cuda=*/true)))
                   : std::string("CPU run (training.dtype compute)"));
    fmt::print("machine       {} ({:.4g} FLOP/s peak), {} per node, {:.4g} B/s in a node, {:.4g} B/s between\n",
               flags.device, flags.plan.peak_flops, flags.plan.gpus_per_node, flags.plan.intra_node_bw,
               flags.plan.inter_node_bw);
    if (flags.do_search) {
      const auto plans = planner.search(config, flags.plan, flags.search);
      fmt::print("layouts of {} devices that fit {} per device, fastest first:\n{}", flags.search.gpus,
                 titan::planner::format_bytes(flags.plan.device_memory), titan::planner::format_search(plans));
      if (!plans.empty()) {
        fmt::print("\nbest:\n{}", titan::planner::format_plan(plans.front()));
        emit(plans.front());
      }
      return plans.empty() ? 2 : 0;
    }
    const auto plan = planner.plan(config, flags.plan);
    fmt::print("{}", titan::planner::format_plan(plan));
    emit(plan);
    return plan.fits() ? 0 : 2;
  });
}
