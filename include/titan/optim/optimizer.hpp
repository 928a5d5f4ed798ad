// SPDX-License-Identifier: BSD-3-Clause
// The optimizer interface: what the trainer steps and what the checkpoint saves and loads. An optimizer
// names its state per parameter (AdamW: exp_avg, exp_avg_sq, step); the checkpoint layer sees only this
// interface, so a new optimizer checkpoints (and reshards) without checkpoint code knowing its type.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

/// One named state tensor of one parameter. It is the optimizer's own storage: a checkpoint load writes
/// into it in place, so loading needs no call back into the optimizer.
struct ParamState {
  std::string name;   ///< the key suffix in a checkpoint ("exp_avg" -> optimizer.<param fqn>.exp_avg)
  at::Tensor tensor;  ///< like_param: shaped and sharded like its parameter; else a whole (unsharded) tensor
  bool like_param = true;
};

/// An optimizer over a list of (local) parameter tensors.
class Optimizer {
 public:
  virtual ~Optimizer() = default;

  /// One update with learning rate `lr` (already scheduled). Parameters without a grad are skipped.
  virtual void step(double lr) = 0;
  /// Drops gradients (sets them undefined, freeing memory; torch's set_to_none=True).
  virtual void zero_grad() {
    for (const at::Tensor& p : params()) p.mutable_grad().reset();
  }
  /// The parameters, in the order the state is indexed by.
  virtual const std::vector<at::Tensor>& params() const = 0;
  /// The state of params()[i], in a fixed order (the order a checkpoint writes it in).
  virtual std::vector<ParamState> state(size_t i) const = 0;
  /// Bytes of optimizer state (for memory accounting).
  int64_t state_bytes() const {
    int64_t bytes = 0;
    for (size_t i = 0; i < params().size(); ++i) {
      for (const ParamState& s : state(i)) bytes += static_cast<int64_t>(s.tensor.nbytes());
    }
    return bytes;
  }
};

}  // namespace titan
