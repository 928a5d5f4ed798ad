// SPDX-License-Identifier: BSD-3-Clause
// Muon (optimizer.name = "Muon"): the 2-D hidden matrices step with momentum orthogonalised by a Newton-Schulz
// iteration, every other parameter (embeddings, the output head, norms, biases, 3-D expert weights) with AdamW on the
// optimizer.* AdamW keys, as torchtitan's DistMuon and Moonlight split them. A matrix steps as torch.optim.Muon
// (torch 2.11) steps it, in the same ATen ops and order: momentum B = lerp(B, g, 1 - mu), the update lerp(g, B, mu)
// (Nesterov) or B, orthogonalised in bf16, then p *= 1 - lr * wd and p -= lr * adjust(A, B) * O.
//
// Sharded matrices (FSDP's Shard(0), TP's colwise Shard(0) and rowwise Shard(1), both at once) are orthogonalised
// whole: each matrix has one owner among the ranks that hold its shards (round-robin by size, DistMuon's balance), its
// bf16 update is gathered there axis by axis, orthogonalised, and scattered back (detail/muon_exchange.hpp). The
// momentum stays sharded like its parameter, so checkpoints save, load and reshard it as they do AdamW's moments.
//
//   titan::Muon optimizer(model.parameters(), config.optimizer, model.parameter_names(),
//                         {.mesh = &run.mesh(), .adamw_modules = model.embedding_and_head_modules()});
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/config.hpp"
#include "titan/optim/adamw.hpp"
#include "titan/optim/optimizer.hpp"

namespace titan {

namespace dist {
class Mesh;
}
namespace detail {
class MuonExchange;
}

/// Newton-Schulz orthogonalisation settings (optimizer.muon_ns_coefficients, muon_ns_steps, muon_eps).
struct NewtonSchulz {
  double a = 3.4445;   ///< the quintic's coefficients: X <- a X + (b A + c A^2) X with A = X X^T
  double b = -4.7750;  ///< see a
  double c = 2.0315;   ///< see a
  int64_t steps = 5;   ///< iterations
  double eps = 1e-7;   ///< floor of the Frobenius norm the input is divided by

  static NewtonSchulz of(const OptimizerConfig& config);
};

/// torch.optim.Muon's orthogonalisation of a 2-D g: in bf16, transposed while it has more rows than columns, divided
/// by its Frobenius norm (at least eps), then `steps` quintic iterations. bf16, shaped like g.
at::Tensor newton_schulz(const at::Tensor& g, const NewtonSchulz& ns);

/// The factor Muon multiplies the lr of an (rows, cols) matrix by (optimizer.muon_adjust_lr_fn).
double muon_lr_ratio(MuonAdjustLr fn, int64_t rows, int64_t cols);

/// Which parameters Muon steps by default: every 2-D one that is neither under a module of `adamw_modules` (module
/// paths: the model's embeddings and head) nor matched by an optimizer.muon_exclude pattern. `names` are the
/// parameters' FQNs, required when there are modules or patterns.
std::vector<bool> muon_matrices(const std::vector<at::Tensor>& params, const std::vector<std::string>& names,
                                const OptimizerConfig& config, const std::vector<std::string>& adamw_modules = {});

/// Where Muon's parameters are and which of them it orthogonalises.
struct MuonOptions {
  /// The mesh the parameters are sharded over; null: whole parameters in one process.
  const dist::Mesh* mesh = nullptr;
  /// Module paths whose parameters step with AdamW: the embeddings and head (RankModel::embedding_and_head_modules).
  std::vector<std::string> adamw_modules{};
  /// Which parameters Muon steps, one flag each (each must be 2-D); empty: muon_matrices(...).
  std::vector<bool> routing{};
  /// Parameter groups of both optimizers, before optimizer.exclude_from_weight_decay's (ParamGroup).
  std::vector<ParamGroup> groups{};
};

class Muon final : public Optimizer {
 public:
  /// Checks config (titan::validate(OptimizerConfig)) and routes each parameter to Muon or AdamW. Collective-free;
  /// under a mesh every rank must construct it with the same parameters in the same order.
  Muon(std::vector<at::Tensor> params, const OptimizerConfig& config, const std::vector<std::string>& names = {},
       MuonOptions options = {});
  ~Muon() override;
  Muon(const Muon&) = delete;
  Muon& operator=(const Muon&) = delete;

  /// `lr` is the step's scheduled optimizer.lr: AdamW steps with it, the matrices with muon_lr x lr / optimizer.lr.
  /// Collective over the axes the matrices are sharded on (the same calls on every rank, in the same order).
  void step(double lr) override;
  const std::vector<at::Tensor>& params() const override { return params_; }
  /// A matrix: momentum_buffer (like the parameter). Any other parameter: AdamW's exp_avg, exp_avg_sq, step.
  std::vector<ParamState> state(size_t i) const override;

  /// Whether params()[i] steps with Muon (else AdamW).
  bool is_matrix(size_t i) const { return matrix_of_.at(i) >= 0; }
  /// How many matrices this rank orthogonalises (whole matrices it holds, and sharded ones it owns).
  int64_t orthogonalised_here() const;

 private:
  std::vector<at::Tensor> params_;
  OptimizerConfig config_;
  std::vector<int64_t> matrix_of_;       // per parameter: its index among the matrices, or -1
  std::vector<int64_t> adamw_of_;        // per parameter: its index among AdamW's parameters, or -1
  std::vector<size_t> matrices_;         // parameter index of each matrix
  std::vector<at::Tensor> momentum_;     // per matrix, like its parameter
  std::vector<ParamSettings> settings_;  // per matrix: weight decay and lr scale (parameter groups)
  std::vector<double> lr_ratios_;        // per matrix: muon_lr_ratio of its global shape
  std::unique_ptr<AdamW> adamw_;
  std::unique_ptr<detail::MuonExchange> exchange_;
};

/// The optimizer optimizer.name asks for: AdamW or Adam over every parameter (with options.groups), or Muon over the
/// matrices and AdamW over the rest. The Trainer's and examples/custom_loop.cpp's optimizer.
std::unique_ptr<Optimizer> build_optimizer(std::vector<at::Tensor> params, const OptimizerConfig& config,
                                           const std::vector<std::string>& names, MuonOptions options = {});

}  // namespace titan
