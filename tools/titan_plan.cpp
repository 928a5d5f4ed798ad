// SPDX-License-Identifier: BSD-3-Clause
// titan-plan: what one rank of a Llama 3 job holds (parameters, gradients, optimizer state,
// activations, communication buffers) against the device memory, and the step time at a stated MFU,
// from the model built on the meta device: nothing is allocated. With --search, the layouts of
// --gpus devices that fit, best first. See docs/memory_planner.md.
//   titan-plan --config llama3_70b --gpus 256 --parallelism.tensor_parallel_degree 8 --device-memory H100
//   titan-plan --config llama3_405b --search --gpus 512 --device-memory 80GB
// Every other flag is the trainer's (--job.config_file, --section.key value).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "titan/core/config_loader.hpp"
#include "titan/core/error.hpp"
#include "titan/metrics/metrics.hpp"
#include "titan/models/llama3/memory_plan.hpp"
#include "titan/models/llama3/model.hpp"

namespace {

constexpr const char* kUsage =
    "usage: titan-plan [--config PRESET] [--job.config_file FILE] [--section.key VALUE ...]\n"
    "                  [--gpus N] [--device-memory 80GB|H100] [--peak-flops F] [--mfu 40%] [--cpu]\n"
    "                  [--search [--limit N]]\n"
    "  --gpus N            devices in the job (default: the product of the parallel degrees)\n"
    "  --device-memory M   memory per device: a size (80GB, 80GiB) or a GPU name (H100, H200, B200, ...)\n"
    "  --peak-flops F      peak dense FLOP/s per device (default: the GPU's from the table, else H100's)\n"
    "  --mfu X             model FLOPs utilisation for the step time (default 40%)\n"
    "  --cpu               plan a CPU run (fp32 compute, CPU kernels) instead of a GPU run\n"
    "  --search            list the layouts of --gpus devices that fit --device-memory, best first\n";

struct Flags {
  titan::llama3::PlanOptions plan{};
  titan::llama3::SearchOptions search{};
  bool do_search = false;
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

int64_t parse_count(const std::string& flag, const std::string& text) {
  int64_t v = 0;
  try {
    size_t end = 0;
    v = std::stoll(text, &end);
    if (end != text.size()) v = 0;
  } catch (const std::exception&) {
    v = 0;
  }
  TITAN_CHECK_VALUE(v >= 1, "[titan-plan] expected {} to be an integer >= 1, got '{}'.", flag, text);
  return v;
}

// Takes titan-plan's own flags out of argv; the rest goes to the config parser.
Flags take_flags(int argc, char** argv, std::vector<const char*>* rest) {
  Flags f;
  bool peak_given = false;
  rest->push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    auto value = [&]() -> std::string {
      TITAN_CHECK_VALUE(i + 1 < argc, "[titan-plan] expected a value after {}, got none.\n{}", key, kUsage);
      return argv[++i];
    };
    if (key == "--search") {
      f.do_search = true;
    } else if (key == "--cpu") {
      f.plan.gpu = false;
    } else if (key == "--gpus") {
      f.plan.world_size = parse_count(key, value());
    } else if (key == "--limit") {
      f.search.limit = parse_count(key, value());
    } else if (key == "--mfu") {
      f.plan.mfu = parse_fraction(value());
    } else if (key == "--peak-flops") {
      const std::string text = value();
      try {
        f.plan.peak_flops = std::stod(text);
      } catch (const std::exception&) {
        f.plan.peak_flops = 0;
      }
      TITAN_CHECK_VALUE(f.plan.peak_flops > 0, "[titan-plan] expected --peak-flops as FLOP/s (989e12), got '{}'.",
                        text);
      peak_given = true;
    } else if (key == "--device-memory") {
      const std::string text = value();
      if (auto bytes = titan::gpu_memory_bytes(text)) {
        f.plan.device_memory = *bytes;
        f.device = text;
      } else {
        f.plan.device_memory = titan::parse_memory_size(text, "--device-memory");
      }
    } else {
      rest->push_back(argv[i]);
    }
  }
  if (!peak_given) f.plan.peak_flops = titan::gpu_peak_flops(f.device).value_or(989e12);
  f.search.gpus = f.plan.world_size;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<const char*> rest;
    const Flags flags = take_flags(argc, argv, &rest);
    titan::ConfigNotes notes;
    const titan::JobConfig config = titan::parse_args(static_cast<int>(rest.size()), rest.data(), &notes);
    if (notes.help_requested) {
      fmt::print("{}\nThe trainer's flags:\n{}", kUsage, titan::config_help());
      return 0;
    }
    TITAN_CHECK_VALUE(!flags.do_search || flags.plan.world_size > 0,
                      "[titan-plan] expected --gpus N with --search, got none. Say how many devices to fill.");
    const auto model = titan::llama3::Llama3::build(config);  // meta device: shapes only
    fmt::print("model         llama3 {} ({} parameters), seq_len {}, local batch {}, {}\n", config.model.flavor,
               model->num_params(), config.training.seq_len, config.training.local_batch_size,
               flags.plan.gpu
                   ? fmt::format("GPU run ({} mixed precision)",
                                 titan::choice_name(titan::mixed_precision_param(config.training, /*cuda=*/true)))
                   : std::string("CPU run (training.dtype compute)"));
    fmt::print("step time at {:.0f}% MFU of {:.4g} FLOP/s ({})\n", 100 * flags.plan.mfu, flags.plan.peak_flops,
               flags.device);
    if (flags.do_search) {
      const auto plans = titan::llama3::search_layouts(*model, config, flags.plan, flags.search);
      fmt::print("layouts of {} devices that fit {} per device, best first:\n{}", flags.search.gpus,
                 titan::llama3::format_bytes(flags.plan.device_memory), titan::llama3::format_search(plans));
      if (!plans.empty()) fmt::print("\nbest:\n{}", titan::llama3::format_plan(plans.front()));
      return plans.empty() ? 2 : 0;
    }
    const auto plan = titan::llama3::plan_memory(*model, config, flags.plan);
    fmt::print("{}", titan::llama3::format_plan(plan));
    return plan.fits() ? 0 : 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", titan::error_message(e));
    return 1;
  }
}
