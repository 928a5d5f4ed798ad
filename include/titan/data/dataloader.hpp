// SPDX-License-Identifier: BSD-3-Clause
// The loader of one data-parallel rank. All ranks walk the same global window stream (documents of
// the weighted sources, tokenized with BOS/EOS, packed into windows of seq_len + 1 tokens); global
// batch k is windows [k*G, (k+1)*G) with G = local_batch_size x grad_accum_steps x dp_degree, and
// dp rank r takes the contiguous slice [r*G/N, (r+1)*G/N) as grad_accum_steps microbatches in order.
// So a global batch holds the same samples under any dp degree / accumulation split, and the state
// at a global-batch boundary is the same JSON on every rank and restores under any layout.
// See docs/data.md.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "titan/core/choices.hpp"  // Packing
#include "titan/data/source.hpp"
#include "titan/data/tokenizer.hpp"

namespace titan::data {

/// A source and its share of a mixture: documents are drawn from source i with probability
/// weight_i / sum(weights), by a counter-based RNG whose position is part of the loader state.
struct WeightedSource {
  std::shared_ptr<Source> source{};  ///< owned by this loader from now on (do not share between loaders)
  double weight = 1.0;               ///< > 0
};

struct DataLoaderOptions {
  int64_t local_batch_size = 8;       ///< windows per microbatch on this rank (training.local_batch_size)
  int64_t seq_len = 2048;             ///< tokens per window row (training.seq_len)
  int64_t dp_rank = 0;                ///< this rank's index on the data-parallel axes (dp_replicate x dp_shard)
  int64_t dp_degree = 1;              ///< number of data-parallel ranks
  int64_t grad_accum_steps = 1;       ///< microbatches per rank per global batch
  Packing packing = Packing::concat;  ///< see titan::Packing (core/choices.hpp)
  int64_t num_workers = 0;            ///< tokenizer threads; 0 = tokenize inside next() on the calling thread
  int64_t prefetch = 2;               ///< global batches prepared ahead when num_workers > 0
  bool loop = true;                   ///< re-read the sources forever (training); false = one pass (validation)
  uint64_t seed = 0;                  ///< mixture RNG seed (part of the stream's identity)
  bool add_bos = true;                ///< BOS before each document (torchtitan)
  bool add_eos = true;                ///< EOS after each document (torchtitan)
};

struct Batch {
  at::Tensor input;         ///< (B, S) int64 token ids
  at::Tensor labels;        ///< (B, S) int64 next-token ids; -100 = no loss (see Packing, chat prompts)
  at::Tensor positions;     ///< (B, S) int64 position within the row's document segment; undefined for concat
  at::Tensor document_ids;  ///< (B, S) int64 segment index within the row (-1 = padding); undefined for concat
};

namespace detail {
class LoaderImpl;
}

class DataLoader {
 public:
  DataLoader(std::vector<WeightedSource> sources, std::shared_ptr<const Tokenizer> tokenizer, DataLoaderOptions config);
  /// One indexed corpus (tests, in-memory documents).
  DataLoader(std::shared_ptr<const Corpus> corpus, std::shared_ptr<const Tokenizer> tokenizer,
             DataLoaderOptions config);
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  /// The next local microbatch. A looping loader never runs out (each pass is logged); a one-pass
  /// loader throws at the end (use try_next).
  Batch next();
  /// The next local microbatch, or nullopt once a one-pass loader has no full global batch left.
  std::optional<Batch> try_next();

  const DataLoaderOptions& config() const;
  /// Windows per global batch: local_batch_size x grad_accum_steps x dp_degree.
  int64_t global_batch_size() const;
  /// Completed passes over the first source, as of the last batch returned.
  int64_t epoch() const;
  /// Bad records skipped so far (OnBadRecord::skip), over all sources.
  int64_t skipped() const;

  /// Position in the global stream after the last microbatch returned. At a global-batch boundary
  /// (the trainer's step boundary) it is the same on every dp rank and loads under any dp degree.
  nlohmann::json state() const;
  /// Continues exactly after `state`: the same windows, also under another dp degree, rank or
  /// accumulation split when the state was taken at a global-batch boundary.
  void load_state(const nlohmann::json& state);

 private:
  std::unique_ptr<detail::LoaderImpl> impl_;
};

}  // namespace titan::data
