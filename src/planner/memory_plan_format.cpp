// SPDX-License-Identifier: BSD-3-Clause
// The planner's output: the table titan-plan prints, the search's list, JSON for scripts and the TOML
// overlay the trainer loads.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "memory_plan_detail.hpp"

namespace titan::planner {

using detail::kGiB;

std::string format_bytes(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB); }

std::string largest_terms(const MemoryPlan& p) {
  const StepTerms& t = p.time;
  std::vector<std::pair<double, const char*>> terms{
      {t.compute, "compute"}, {t.recompute, "recompute"}, {t.fsdp, "FSDP comm"},  {t.tp, "TP comm"},
      {t.cp, "CP comm"},      {t.pp, "PP bubble"},        {t.ep, "EP all-to-all"}};
  std::sort(terms.begin(), terms.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  const double total = std::max(t.total(), 1e-30);
  for (size_t i = 0; i < 3 && terms[i].first > 0; ++i) {
    out += fmt::format("{}{} {:.0f}%", out.empty() ? "" : ", ", terms[i].second, 100 * terms[i].first / total);
  }
  return out;
}

std::string format_plan(const MemoryPlan& p) {
  const MemoryParts& m = p.parts;
  std::string out = fmt::format(
      "layout        {}\n"
      "AC            {}; microbatch {} sequences, {} per step; {} in flight on pp rank {}\n"
      "per rank (pp rank {}):\n"
      "  parameters     {:>12}  ({} B)\n"
      "  gradients      {:>12}  ({} B)\n"
      "  optimizer      {:>12}  ({} B)\n"
      "  activations    {:>12}  ({} per microbatch kept for backward{})\n"
      "  communication  {:>12}\n"
      "  total          {:>12}  (tensors at their peak)",
      p.mesh.ep > 1 || p.mesh.etp > 1
          ? fmt::format("{}, ep {} (efsdp {}){}", p.mesh, p.mesh.ep, p.mesh.efsdp(),
                        p.mesh.etp > 1 ? fmt::format(", etp {}", p.mesh.etp) : std::string())
          : fmt::format("{}", p.mesh),
      p.ac, p.microbatch, p.microbatches, p.in_flight, p.pp_rank, p.pp_rank, format_bytes(m.parameters), m.parameters,
      format_bytes(m.gradients), m.gradients, format_bytes(m.optimizer), m.optimizer, format_bytes(m.activations),
      format_bytes(p.activations_per_microbatch),
      p.expert_dispatch > 0
          ? fmt::format("; an MoE layer's routed tokens and dispatch {}", format_bytes(p.expert_dispatch))
          : std::string(),
      format_bytes(m.communication), format_bytes(m.total()));
  if (p.outside_allocator > 0) {  // a GPU plan: a CPU run has no caching allocator, context or NCCL
    out += fmt::format(
        "\n  reserved       {:>12}  (the caching allocator's peak: what torchtitan logs as memory)"
        "\n  outside        {:>12}  (CUDA context, NCCL buffers)",
        format_bytes(p.reserved), format_bytes(p.outside_allocator));
  }
  if (p.device_memory > 0) {
    out += fmt::format("\n  needs          {:>12}  of {} ({:.1f}%): {}\n", format_bytes(p.needed()),
                       format_bytes(p.device_memory),
                       100.0 * static_cast<double>(p.needed()) / static_cast<double>(p.device_memory),
                       p.fits() ? "fits" : "DOES NOT FIT");
  } else {
    out += "\n";
  }
  if (p.trainable_params != p.params) {
    out += fmt::format(
        "trainable     {} of {} parameters ({:.3g}%): LoRA adapters beside frozen base weights\n", p.trainable_params,
        p.params,
        100.0 * static_cast<double>(p.trainable_params) / static_cast<double>(std::max<int64_t>(1, p.params)));
  }
  out += fmt::format("FLOPs         {:.3e} per device per step", p.flops_per_step);
  if (p.step_seconds > 0) {
    const StepTerms& t = p.time;
    out += fmt::format(
        "; step {:.2f} s, {:.0f} tokens/s per device\n"
        "step time     compute {:.2f} s at {:.1f}% of peak, recompute {:.2f}, FSDP {:.2f}, TP {:.2f}, CP {:.2f}, "
        "PP bubble {:.2f}, EP {:.2f} (largest: {})",
        p.step_seconds, p.tokens_per_second, t.compute, 100 * p.compute_efficiency, t.recompute, t.fsdp, t.tp, t.cp,
        t.pp, t.ep, largest_terms(p));
  }
  return out + "\n";
}

std::string format_search(const std::vector<MemoryPlan>& plans) {
  std::string out = fmt::format("{:>4} {:>8} {:>3} {:>3} {:>3} {:>3} {:>12} {:>3} {:>12} {:>10} {:>9} {:>8}  {}\n", "#",
                                "dp_shard", "tp", "pp", "cp", "ep", "AC", "mb", "reserved GiB", "tokens/s", "step s",
                                "free GiB", "largest time terms");
  int64_t i = 0;
  for (const auto& p : plans) {
    out += fmt::format("{:>4} {:>8} {:>3} {:>3} {:>3} {:>3} {:>12} {:>3} {:>12.2f} {:>10.1f} {:>9.2f} {:>8.2f}  {}\n",
                       ++i, p.mesh.dp_shard, p.mesh.tp, p.mesh.pp, p.mesh.cp, p.mesh.ep, p.ac, p.microbatch,
                       static_cast<double>(p.reserved) / kGiB, p.tokens_per_second, p.step_seconds,
                       static_cast<double>(p.headroom()) / kGiB, largest_terms(p));
  }
  if (plans.empty()) out += "no layout fits\n";
  return out;
}

std::string plan_json(const MemoryPlan& p) {
  const MemoryParts& m = p.parts;
  const StepTerms& t = p.time;
  return fmt::format(
      "{{\"mesh\": {{\"pp\": {}, \"dp_replicate\": {}, \"dp_shard\": {}, \"cp\": {}, \"tp\": {}, \"ep\": {}}}, "
      "\"ac\": \"{}\", \"microbatch\": {}, \"microbatches\": {}, \"local_batch\": {}, \"global_batch\": {}, "
      "\"pp_rank\": {}, \"in_flight\": {}, \"params\": {}, \"trainable_params\": {}, "
      "\"bytes\": {{\"parameters\": {}, \"gradients\": {}, \"optimizer\": {}, \"activations\": {}, "
      "\"communication\": {}, \"expert_dispatch\": {}, \"total\": {}, \"reserved\": {}, \"outside_allocator\": {}, "
      "\"needed\": {}, "
      "\"device_memory\": {}}}, \"fits\": {}, "
      "\"flops_per_step\": {:.6e}, \"compute_efficiency\": {:.4f}, "
      "\"seconds\": {{\"compute\": {:.6g}, \"recompute\": {:.6g}, \"fsdp\": {:.6g}, \"tp\": {:.6g}, "
      "\"cp\": {:.6g}, \"pp\": {:.6g}, \"ep\": {:.6g}, \"step\": {:.6g}}}, \"tokens_per_second\": {:.6g}}}",
      p.mesh.pp, p.mesh.dp_replicate, p.mesh.dp_shard, p.mesh.cp, p.mesh.tp, p.mesh.ep, p.ac, p.microbatch,
      p.microbatches, p.local_batch, p.global_batch, p.pp_rank, p.in_flight, p.params, p.trainable_params, m.parameters,
      m.gradients, m.optimizer, m.activations, m.communication, p.expert_dispatch, m.total(), p.reserved,
      p.outside_allocator, p.needed(), p.device_memory, p.fits() ? "true" : "false", p.flops_per_step,
      p.compute_efficiency, t.compute, t.recompute, t.fsdp, t.tp, t.cp, t.pp, t.ep, p.step_seconds,
      p.tokens_per_second);
}

std::string plan_toml(const MemoryPlan& p) {
  std::string ac = "mode = \"none\"";
  if (p.ac == "full") ac = "mode = \"full\"";
  if (p.ac == "op") ac = "mode = \"selective\"\nselective_ac_option = \"op\"";
  if (p.ac.starts_with("selective ")) {
    ac = fmt::format("mode = \"selective\"\nselective_ac_option = \"{}\"", p.ac.substr(10));
  }
  return fmt::format(
      "# titan-plan's layout: {:.0f} tokens/s per device predicted, {} reserved of {} per device.\n"
      "[parallelism]\n"
      "data_parallel_replicate_degree = {}\n"
      "data_parallel_shard_degree = {}\n"
      "tensor_parallel_degree = {}\n"
      "pipeline_parallel_degree = {}\n"
      "pipeline_parallel_microbatch_size = {}\n"
      "context_parallel_degree = {}\n"
      "expert_parallel_degree = {}\n\n"
      "[training]\n"
      "local_batch_size = {}\n"
      "global_batch_size = {}\n\n"
      "[activation_checkpoint]\n"
      "{}\n",
      p.tokens_per_second, format_bytes(p.reserved), format_bytes(p.device_memory), p.mesh.dp_replicate,
      p.mesh.dp_shard, p.mesh.tp, p.mesh.pp, p.microbatch, p.mesh.cp, p.mesh.ep, p.local_batch, p.global_batch, ac);
}

}  // namespace titan::planner
