// SPDX-License-Identifier: BSD-3-Clause
// FSDP's float8 all-gather (torchao's WeightWithDynamicFloat8CastTensor fsdp_pre_all_gather /
// fsdp_post_all_gather and precompute_float8_dynamic_scale_for_fsdp): each rank casts its shard to
// e4m3 with the scale of the whole tensor's amax (all-reduce MAX of the shard amaxes), the 1-byte
// shards are all-gathered, and the layer gets the gathered bytes and scale from with_param
// (parallel::GatheredFloat8) instead of a high-precision weight. Gradients are unchanged (high precision).
#include <ATen/ATen.h>

#include <limits>

#include "data_parallel_state.hpp"
#include "titan/float8/cast.hpp"

namespace titan::parallel::detail {
namespace {

// torchao's weight cast under the tensorwise recipe.
const float8::CastSpec kWeight{.dtype = at::kFloat8_e4m3fn};

}  // namespace

std::vector<dist::ProcessGroup> DataParallelState::float8_amax_groups() const {
  std::vector<dist::ProcessGroup> groups{shard};
  if (float8_tp) groups.push_back(*float8_tp);  // the shard is a shard of a TP shard: the whole is wider
  return groups;
}

void DataParallelState::precompute_float8_scales() {
  at::NoGradGuard no_grad;
  std::vector<UnitParam*> params;
  std::vector<at::Tensor> amaxes;
  for (auto& unit : units) {
    for (auto& p : unit.params) {
      if (!p.float8) continue;
      params.push_back(&p);
      amaxes.push_back(float8::tensor_amax(p.param));  // () of the local shard
    }
  }
  if (params.empty()) return;
  at::Tensor amax = at::stack(amaxes);  // (float8 params): one all-reduce for all of them
  for (const dist::ProcessGroup& group : float8_amax_groups()) group.all_reduce(amax, dist::ReduceOp::kMax).wait();
  const at::Tensor scales = float8::amax_to_scale(amax, kWeight);  // (float8 params)
  for (size_t i = 0; i < params.size(); ++i) params[i]->float8_scale.copy_(scales[static_cast<int64_t>(i)]);
  float8_scales_stale = false;
}

at::Tensor DataParallelState::gathered_float8_alias(const UnitParam& p) const {
  at::NoGradGuard no_grad;
  return at::empty({0}, at::TensorOptions().dtype(at::kFloat8_e4m3fn).device(p.param.device()))
      .set_(c10::Storage(p.gathered8), 0, p.full_shape, c10::contiguous_strides(p.full_shape));
}

at::Tensor DataParallelState::float8_carrier(const UnitParam& p) const {
  at::NoGradGuard no_grad;
  // One NaN seen at every index (zero strides): no memory, and a layer that reads it instead of
  // taking the float8 form computes NaN rather than something plausible.
  const at::Tensor nan = at::full({1}, std::numeric_limits<double>::quiet_NaN(),
                                  at::TensorOptions().dtype(options.param_dtype).device(p.param.device()));
  return at::empty({0}, nan.options())
      .set_(nan.storage(), 0, p.full_shape, std::vector<int64_t>(p.full_shape.size(), 0));
}

void DataParallelState::start_gather_float8(Unit& unit, UnitParam& p) {
  // Called from start_gather: unit state, no-grad and the communication memory scope are set.
  if (options.float8_precompute_scales) {
    if (float8_scales_stale) precompute_float8_scales();  // the first gather of this forward
  } else {
    at::Tensor amax = float8::tensor_amax(p.param).reshape({1});  // (1): one all-reduce per parameter per gather
    for (const dist::ProcessGroup& group : float8_amax_groups()) group.all_reduce(amax, dist::ReduceOp::kMax).wait();
    p.float8_scale.copy_(float8::amax_to_scale(amax, kWeight).reshape({}));
  }
  const at::Tensor in = float8::cast_with_scale(p.param, p.float8_scale, at::kFloat8_e4m3fn)
                            .data.view(at::kByte);  // (rows_per_rank, ...)
  const size_t nbytes = static_cast<size_t>(c10::multiply_integers(p.full_shape));
  p.gathered8->set_data_ptr_noswap(p.gathered8->allocator()->allocate(nbytes));
  p.gathered8->set_nbytes(nbytes);
  const int64_t n = shard.size();
  at::Tensor out =  // (N * rows_per_rank, ...) bytes: the gathered storage itself unless rows are padded
      n * p.rows_per_rank == p.full_shape[0] ? gathered_float8_alias(p).view(at::kByte)
                                             : at::empty(p.padded_shape(n), in.options());
  unit.gather_works.push_back(shard.all_gather(out, in));
  p.float8_buffers = {in, std::move(out)};
}

void DataParallelState::finish_gather_float8(UnitParam& p) {
  const at::Tensor& landed = p.float8_buffers.at(1);  // (N * rows_per_rank, ...) bytes
  if (landed.size(0) != p.full_shape[0]) {
    gathered_float8_alias(p).view(at::kByte).copy_(landed.narrow(0, 0, p.full_shape[0]));
  }
  p.float8_buffers.clear();
}

}  // namespace titan::parallel::detail
