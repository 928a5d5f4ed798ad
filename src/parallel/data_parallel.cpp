// SPDX-License-Identifier: BSD-3-Clause
#include "titan/parallel/data_parallel.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "data_parallel_state.hpp"
#include "find_module.hpp"
#include "titan/core/error.hpp"
#include "titan/dist/mesh.hpp"

namespace titan::parallel {
namespace {

// "" is the root: every parameter is under it.
bool under(const std::string& fqn, const std::string& module_path) {
  return module_path.empty() || detail::is_under(fqn, module_path);
}

std::string unit_name(const std::vector<std::string>& paths) {
  return paths.empty() ? "root" : fmt::format("{}", fmt::join(paths, "+"));
}

// Moves p's data to this rank's dim-0 shard (zero-padded to rows_per_rank) and records where it lies.
detail::UnitParam shard_param(const std::string& fqn, at::Tensor param, const dist::ProcessGroup& group,
                              const DataParallelOptions& options) {
  TITAN_CHECK_VALUE(param.dim() >= 1,
                    "[titan::parallelize] expected parameters with at least one dim, "
                    "got a scalar '{}'. Make it shape (1).",
                    fqn);
  detail::UnitParam p;
  p.full_shape = param.sizes().vec();
  const int64_t n = group.size();
  const int64_t rows = p.full_shape[0];
  p.rows_per_rank = (rows + n - 1) / n;
  p.row_numel = rows == 0 ? 0 : param.numel() / rows;
  if (n > 1) {
    at::NoGradGuard no_grad;
    std::vector<int64_t> shard_shape = p.full_shape;
    shard_shape[0] = p.rows_per_rank;
    at::Tensor shard = at::zeros(shard_shape, param.options());  // (rows_per_rank, ...)
    const int64_t begin = std::min(rows, group.rank() * p.rows_per_rank);
    const int64_t valid = std::min(rows, begin + p.rows_per_rank) - begin;
    if (valid > 0) shard.narrow(0, 0, valid).copy_(param.narrow(0, begin, valid));
    param.set_data(shard);
    p.gathered =
        at::empty(p.full_shape, param.options().dtype(options.param_dtype)).storage().getWeakStorageImpl().lock();
    p.gathered->reset();
  }
  p.param = std::move(param);
  return p;
}

// p's sharding: dim 0 of its data (the whole tensor, or the TP shard `prior` describes) split over
// dp_shard, composed with what was applied before.
ShardedParam describe_param(const std::string& fqn, const detail::UnitParam& p, const dist::ProcessGroup& group,
                            const std::string& axis, const detail::Binding* prior) {
  ShardedParam info;
  static_cast<TensorLayout&>(info) =
      prior != nullptr ? static_cast<const TensorLayout&>(prior->info) : TensorLayout::whole(p.full_shape);
  info.fqn = fqn;
  info.local = p.param;
  if (group.size() > 1) {
    info.placements.emplace_back(axis, Placement::shard(0));
    const int64_t rows = info.local_shape[0];
    const int64_t begin = std::min(rows, group.rank() * p.rows_per_rank);
    info.offset[0] += begin;
    info.local_shape[0] = std::min(rows, begin + p.rows_per_rank) - begin;
  }
  return info;
}

}  // namespace

DataParallel::DataParallel(std::unique_ptr<detail::DataParallelState> state) : state_(std::move(state)) {}
DataParallel::~DataParallel() = default;

std::string DataParallel::describe() const {
  const int64_t shard = state_->shard.size(), replicate = state_->replicate.size();
  if (shard > 1 && replicate > 1) {
    return fmt::format("HSDP(dp_replicate={}, {}={})", replicate, state_->shard_axis, shard);
  }
  if (shard > 1) return fmt::format("FSDP({}={})", state_->shard_axis, shard);
  return fmt::format("DDP(dp_replicate={})", replicate);
}

int64_t DataParallel::num_units() const { return static_cast<int64_t>(state_->units.size()); }

std::vector<std::string> DataParallel::unit_names() const {
  std::vector<std::string> names;
  for (const auto& unit : state_->units) names.push_back(unit.name);
  return names;
}

std::vector<DataParallelUnit> DataParallel::units() const {
  std::vector<DataParallelUnit> out;
  for (const detail::Unit& unit : state_->units) {
    DataParallelUnit& u = out.emplace_back(DataParallelUnit{.name = unit.name});
    for (const detail::UnitParam& p : unit.params) {
      const detail::Binding* binding = detail::find_binding(p.param);
      u.params.push_back({.fqn = binding != nullptr ? binding->info.fqn : std::string(),
                          .gathered_numel = c10::multiply_integers(p.full_shape),
                          .shard_numel = p.param.numel(),
                          .float8 = p.float8,
                          .trained = p.param.requires_grad()});
    }
  }
  return out;
}

bool DataParallel::defers_gradient_sync() const { return !state_->gradient_sync; }

int64_t DataParallel::gathered_bytes() const { return state_->gathered_bytes(); }
std::vector<DataParallelEvent> DataParallel::trace() const { return state_->events; }
void DataParallel::clear_trace() { state_->events.clear(); }
void DataParallel::reshard() { state_->free_all(); }
void DataParallel::precompute_float8_scales() { state_->precompute_float8_scales(); }
const detail::DataParallelState& DataParallel::state() const { return *state_; }

void detail::validate_data_parallel(const torch::nn::Module& model, const std::vector<std::vector<std::string>>& units,
                                    const DataParallelOptions& options) {
  auto& root = const_cast<torch::nn::Module&>(model);  // only read
  for (const auto& paths : units) {
    for (const auto& path : paths) find_module(root, path, "data_parallel.units");
  }
  const auto params = root.named_parameters(/*recurse=*/true);
  for (const std::string& fqn : options.float8_all_gather) {
    TITAN_CHECK_VALUE(params.contains(fqn),
                      "[titan::parallelize] expected data_parallel.options.float8_all_gather to name parameters of "
                      "the model, got '{}'. Name the weights of float8 Linears (float8::fsdp_float8_weights).",
                      fqn);
  }
}

namespace {

// Shards over mesh axis shard_axis (replicas over dp_replicate) the parameters under `units`, and with
// root_unit the rest of the model's parameters as one last unit.
std::unique_ptr<detail::DataParallelState> shard_units(torch::nn::Module& model,
                                                       const std::vector<std::vector<std::string>>& units,
                                                       const dist::Mesh& mesh, const std::string& shard_axis,
                                                       bool root_unit, const DataParallelOptions& options) {
  const dist::ProcessGroup& shard = mesh.group(shard_axis);
  const dist::ProcessGroup& replicate = mesh.group("dp_replicate");
  const auto params = model.named_parameters(/*recurse=*/true);
  const bool on_cpu = params.is_empty() || params[0].value().device().is_cpu();
  const bool per_param = options.collectives == DataParallelCollectives::per_param ||
                         (options.collectives == DataParallelCollectives::auto_ && on_cpu);
  auto state = std::make_unique<detail::DataParallelState>(shard, replicate, options, per_param);
  state->shard_axis = shard_axis;
  if (!options.float8_all_gather.empty() && mesh.size("tp") > 1) state->float8_tp = mesh.group("tp");
  // Units in forward order, the root (parameters under no unit) last; a parameter shared by two
  // modules (tied weights) belongs to the first unit that reaches it.
  std::vector<std::vector<std::string>> specs = units;
  if (root_unit) specs.emplace_back();
  std::unordered_set<const c10::TensorImpl*> taken;
  std::vector<std::vector<std::string>> unit_fqns;
  // What tensor parallelism bound before: its placements and per-use transform carry over.
  std::vector<std::vector<std::optional<detail::Binding>>> priors;
  for (const auto& paths : specs) {
    detail::Unit unit{.name = unit_name(paths)};
    std::vector<std::string> fqns;
    std::vector<std::optional<detail::Binding>> unit_priors;
    for (const auto& item : params) {
      const bool member = paths.empty() || std::any_of(paths.begin(), paths.end(),
                                                       [&](const std::string& p) { return under(item.key(), p); });
      if (!member || !taken.insert(item.value().unsafeGetTensorImpl()).second) continue;
      const auto& ignored = options.ignored_params;
      if (std::find(ignored.begin(), ignored.end(), item.key()) != ignored.end()) continue;
      const detail::Binding* prior = detail::find_binding(item.value());
      TITAN_CHECK_VALUE(prior == nullptr || prior->handler == nullptr,
                        "[titan::parallelize] expected "
                        "'{}' not yet data-parallel, got it already bound. Apply data parallelism once per model.",
                        item.key());
      unit_priors.push_back(prior ? std::optional<detail::Binding>(*prior) : std::nullopt);
      detail::UnitParam p = shard_param(item.key(), item.value(), shard, options);
      if (shard.size() > 1 && std::find(options.float8_all_gather.begin(), options.float8_all_gather.end(),
                                        item.key()) != options.float8_all_gather.end()) {
        p.float8 = true;
        p.gathered8 =
            at::empty(p.full_shape, p.param.options().dtype(at::kFloat8_e4m3fn)).storage().getWeakStorageImpl().lock();
        p.gathered8->reset();
        p.float8_scale = at::ones({}, p.param.options().dtype(at::kFloat));  // ()
      }
      p.offset = unit.chunk_numel;
      unit.chunk_numel += p.shard_numel();
      unit.params.push_back(std::move(p));
      fqns.push_back(item.key());
    }
    if (unit.params.empty()) continue;
    state->units.push_back(std::move(unit));
    unit_fqns.push_back(std::move(fqns));
    priors.push_back(std::move(unit_priors));
  }
  const int64_t last = static_cast<int64_t>(state->units.size()) - 1;
  for (int64_t u = 0; u <= last; ++u) {
    detail::Unit& unit = state->units[static_cast<size_t>(u)];
    // The last unit is never freed after forward (no hook marks the end of the model's forward, and
    // backward starts with it); "default" also keeps the unit before it, as torchtitan before 0.2 kept the last
    // transformer block, which backward would re-gather immediately.
    unit.reshard_after_forward = (options.reshard_after_forward == ReshardAfterForward::always && u < last) ||
                                 (options.reshard_after_forward == ReshardAfterForward::default_ && u < last - 1);
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const auto& prior = priors[static_cast<size_t>(u)][i];
      detail::bind_param(unit.params[i].param,
                         {.info = describe_param(unit_fqns[static_cast<size_t>(u)][i], unit.params[i], shard,
                                                 shard_axis, prior ? &*prior : nullptr),
                          .handler = state.get(),
                          .unit = u,
                          .index = static_cast<int64_t>(i),
                          .transform = prior ? prior->transform : nullptr});
    }
  }
  return state;
}

}  // namespace

std::unique_ptr<DataParallel> detail::apply_data_parallel(torch::nn::Module& model,
                                                          const std::vector<std::vector<std::string>>& units,
                                                          const dist::Mesh& mesh, const DataParallelOptions& options) {
  // Under context parallelism the cp ranks shard parameters too (torchtitan's dp_shard_cp).
  const std::string shard_axis = mesh.size("cp") > 1 ? "dp_shard_cp" : "dp_shard";
  return std::unique_ptr<DataParallel>(
      new DataParallel(shard_units(model, units, mesh, shard_axis, /*root_unit=*/true, options)));
}

std::unique_ptr<DataParallel> detail::apply_expert_data_parallel(torch::nn::Module& model,
                                                                 const std::vector<std::string>& experts,
                                                                 const dist::Mesh& mesh,
                                                                 const DataParallelOptions& options) {
  std::vector<std::vector<std::string>> units;
  for (const std::string& path : experts) units.push_back({path});
  return std::unique_ptr<DataParallel>(
      new DataParallel(shard_units(model, units, mesh, "efsdp", /*root_unit=*/false, options)));
}

}  // namespace titan::parallel
