// SPDX-License-Identifier: BSD-3-Clause
// DataLoader: global batches of the packed window stream, this rank's slice as microbatches, made
// on the calling thread or by a producer thread ahead of time; the state at global-batch boundaries.
#include "titan/data/dataloader.hpp"

#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "doc_feed.hpp"
#include "titan/core/error.hpp"

namespace titan::data {
namespace detail {
namespace {

constexpr int kStateVersion = 2;

// One global batch as this rank sees it: its microbatches and the state after the whole batch.
struct GlobalBatch {
  std::vector<Batch> micro{};
  nlohmann::json state_after{};
  int64_t epoch = 0;
  bool end = false;
  std::exception_ptr error{};
};

}  // namespace

class LoaderImpl {
 public:
  LoaderImpl(std::vector<WeightedSource> sources, std::shared_ptr<const Tokenizer> tokenizer, DataLoaderOptions c)
      : config_(c),
        stream_(std::move(sources), c.seed, c.loop),
        packer_(c.packing, c.seq_len, tokenizer ? tokenizer->eos_id().value_or(0) : 0),
        committed_(stream_.initial_state()),
        feed_(stream_, tokenizer, c.add_bos, c.add_eos, c.num_workers) {
    TITAN_CHECK_VALUE(tokenizer != nullptr, "[titan::data::DataLoader] expected a tokenizer, got null.");
    TITAN_CHECK_VALUE(c.local_batch_size >= 1 && c.seq_len >= 1 && c.grad_accum_steps >= 1,
                      "[titan::data::DataLoader] expected local_batch_size, seq_len and grad_accum_steps >= 1, got "
                      "{}, {} and {}.",
                      c.local_batch_size, c.seq_len, c.grad_accum_steps);
    TITAN_CHECK_VALUE(c.dp_degree >= 1 && c.dp_rank >= 0 && c.dp_rank < c.dp_degree,
                      "[titan::data::DataLoader] expected 0 <= dp_rank < dp_degree, got dp_rank {} and dp_degree {}.",
                      c.dp_rank, c.dp_degree);
    TITAN_CHECK_VALUE(c.num_workers >= 0 && c.prefetch >= 1,
                      "[titan::data::DataLoader] expected num_workers >= 0 "
                      "and prefetch >= 1, got {} and {}.",
                      c.num_workers, c.prefetch);
    boundary_state_ = make_state();
  }

  ~LoaderImpl() { stop(); }

  const DataLoaderOptions& config() const { return config_; }
  int64_t global_batch_size() const { return config_.local_batch_size * config_.grad_accum_steps * config_.dp_degree; }
  int64_t epoch() const { return epoch_; }
  int64_t skipped() const {
    int64_t n = 0;
    for (size_t i = 0; i < stream_.size(); ++i) n += stream_.source(i).skipped();
    return n;
  }

  std::optional<Batch> try_next() {
    if (!current_ || micro_index_ == config_.grad_accum_steps) {
      // After an error or the end the producer has stopped: answer the same again instead of waiting.
      if (finished_.error) std::rethrow_exception(finished_.error);
      if (finished_.end) return std::nullopt;
      GlobalBatch batch = config_.num_workers > 0 ? pop() : make();
      if (batch.error || batch.end) {
        finished_ = std::move(batch);
        return try_next();
      }
      before_state_ = boundary_state_;
      current_ = std::move(batch);
      micro_index_ = resume_micro_;
      resume_micro_ = 0;
    }
    Batch out = std::move(current_->micro[size_t(micro_index_++)]);
    if (micro_index_ == config_.grad_accum_steps) {
      boundary_state_ = current_->state_after;
      epoch_ = current_->epoch;
    }
    return out;
  }

  nlohmann::json state() const {
    if (!current_ || micro_index_ == 0 || micro_index_ == config_.grad_accum_steps) return boundary_state_;
    // Inside a global batch the consumed windows are not a prefix of the global stream, so this
    // state restores only under the same layout.
    nlohmann::json j = before_state_;
    j["microbatch"] = micro_index_;
    j["layout"] = layout();
    return j;
  }

  void load_state(const nlohmann::json& j) {
    TITAN_CHECK_VALUE(
        j.is_object() && j.value("version", 0) == kStateVersion && j.contains("stream") && j.contains("carry"),
        "[titan::data::DataLoader] expected a loader state {{\"version\": {}, "
        "\"stream\": ..., \"carry\": ...}}, got {}.",
        kStateVersion, j.dump().substr(0, 200));
    TITAN_CHECK_VALUE(j.at("seq_len").get<int64_t>() == config_.seq_len &&
                          j.at("packing").get<std::string>() == choice_name(config_.packing),
                      "[titan::data::DataLoader] expected a state saved with seq_len {} and {} packing, got seq_len "
                      "{} and {} packing. Resume with the data settings of the checkpoint.",
                      config_.seq_len, config_.packing, j.at("seq_len").get<int64_t>(), j.at("packing").dump());
    const int64_t micro = j.value("microbatch", int64_t(0));
    TITAN_CHECK_VALUE(micro == 0 || j.at("layout") == layout(),
                      "[titan::data::DataLoader] expected a state taken at "
                      "a step boundary, or inside a step under this layout {}, got microbatch {} under {}. Save "
                      "the loader state between steps.",
                      layout().dump(), micro, j.value("layout", nlohmann::json()).dump());
    stop();
    committed_ = stream_state_from_json(j.at("stream"), stream_);
    feed_.reset();
    stream_.restore(committed_);
    packer_.load_carry(j.at("carry"));
    batches_ = j.at("batches").get<int64_t>();
    boundary_state_ = j;
    boundary_state_.erase("microbatch");
    boundary_state_.erase("layout");
    resume_micro_ = micro;
    finished_ = {};
    current_.reset();
    micro_index_ = 0;
    epoch_ = committed_.cursors.front().epoch;
    empty_run_ = 0;
  }

 private:
  nlohmann::json layout() const {
    return {{"dp_degree", config_.dp_degree},
            {"grad_accum_steps", config_.grad_accum_steps},
            {"local_batch_size", config_.local_batch_size}};
  }

  nlohmann::json make_state() const {
    return {{"version", kStateVersion},
            {"stream", to_json(committed_, stream_)},
            {"carry", packer_.carry()},
            {"batches", batches_},
            {"seq_len", config_.seq_len},
            {"packing", std::string(choice_name(config_.packing))},
            {"global_batch_size", global_batch_size()}};
  }

  int64_t epochs() const {
    int64_t n = 0;
    for (const SourceCursor& c : committed_.cursors) n += c.epoch;
    return n;
  }

  // The next window of the global stream; false when a one-pass stream is over.
  bool next_window(Window& w) {
    while (!packer_.pop(w)) {
      TokenizedDoc doc;
      if (!feed_.next(doc)) return false;
      advance(committed_, doc.after);
      if (doc.ids.empty() && !doc.skipped) {
        if (empty_run_++ == 0) empty_run_epochs_ = epochs();
        // Two passes' worth of documents without a token: looping would never fill a window.
        TITAN_CHECK_VALUE(epochs() - empty_run_epochs_ < 2,
                          "[titan::data::DataLoader] dataset \"{}\": expected "
                          "tokens, got none from a whole pass over its documents. The documents are empty and the "
                          "tokenizer adds no BOS/EOS.",
                          stream_.source(size_t(doc.after.source)).name());
      } else if (!doc.ids.empty()) {
        empty_run_ = 0;
      }
      packer_.add(doc);
    }
    return true;
  }

  GlobalBatch make() {
    const int64_t B = config_.local_batch_size, S = config_.seq_len, A = config_.grad_accum_steps;
    const bool per_document = config_.packing != Packing::concat;
    GlobalBatch out;
    for (int64_t m = 0; m < A; ++m) {
      Batch b{.input = at::empty({B, S}, at::kLong),
              .labels = at::empty({B, S}, at::kLong),
              .positions = {},
              .document_ids = {}};
      if (per_document) {
        b.positions = at::empty({B, S}, at::kLong);
        b.document_ids = at::empty({B, S}, at::kLong);
      }
      out.micro.push_back(std::move(b));
    }
    const int64_t first = config_.dp_rank * B * A, last = first + B * A;  // this rank's windows
    Window w;
    for (int64_t i = 0; i < global_batch_size(); ++i) {
      if (!next_window(w)) return {.micro = {}, .state_after = {}, .epoch = 0, .end = true, .error = {}};
      if (i < first || i >= last) continue;
      Batch& b = out.micro[size_t((i - first) / B)];
      write_row(w, config_.packing, (i - first) % B, S, b.input.data_ptr<int64_t>(), b.labels.data_ptr<int64_t>(),
                per_document ? b.positions.data_ptr<int64_t>() : nullptr,
                per_document ? b.document_ids.data_ptr<int64_t>() : nullptr);
    }
    ++batches_;
    out.state_after = make_state();
    out.epoch = committed_.cursors.front().epoch;
    return out;
  }

  // ---- producer thread (num_workers > 0) ----
  GlobalBatch pop() {
    if (!producer_.joinable()) start();
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !queue_.empty(); });
    GlobalBatch b = std::move(queue_.front());
    queue_.pop_front();
    changed_.notify_all();
    return b;
  }

  void start() {
    stop_ = false;
    producer_ = std::thread([this] {
      while (true) {
        GlobalBatch b;
        try {
          b = make();
        } catch (...) {
          b.error = std::current_exception();
        }
        const bool last = b.end || b.error;
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || int64_t(queue_.size()) < config_.prefetch; });
        if (stop_) return;
        queue_.push_back(std::move(b));
        changed_.notify_all();
        if (last) return;
      }
    });
  }

  void stop() {
    if (!producer_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    producer_.join();
    queue_.clear();
  }

  DataLoaderOptions config_;
  DocumentStream stream_;
  Packer packer_;
  StreamState committed_;  // the stream position after the documents handed to the packer
  DocFeed feed_;
  int64_t batches_ = 0;  // global batches made
  int64_t empty_run_ = 0, empty_run_epochs_ = 0;

  // Consumer side (the training thread).
  std::optional<GlobalBatch> current_;
  GlobalBatch finished_;      // the end or the error, once met
  int64_t micro_index_ = 0;   // next microbatch of current_
  int64_t resume_micro_ = 0;  // microbatches to skip in the first batch after load_state
  nlohmann::json boundary_state_, before_state_;
  int64_t epoch_ = 0;

  std::thread producer_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<GlobalBatch> queue_;
  bool stop_ = false;
};

}  // namespace detail

DataLoader::DataLoader(std::vector<WeightedSource> sources, std::shared_ptr<const Tokenizer> tokenizer,
                       DataLoaderOptions config)
    : impl_(std::make_unique<detail::LoaderImpl>(std::move(sources), std::move(tokenizer), config)) {}

DataLoader::DataLoader(std::shared_ptr<const Corpus> corpus, std::shared_ptr<const Tokenizer> tokenizer,
                       DataLoaderOptions config)
    : DataLoader(std::vector<WeightedSource>{{.source = corpus_source(std::move(corpus)), .weight = 1.0}},
                 std::move(tokenizer), config) {}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

Batch DataLoader::next() {
  std::optional<Batch> b = impl_->try_next();
  TITAN_CHECK_VALUE(b.has_value(),
                    "[titan::data::DataLoader] expected another batch, got the end of a one-pass "
                    "loader (loop = false). Use try_next() to stop at the end.");
  return std::move(*b);
}

std::optional<Batch> DataLoader::try_next() { return impl_->try_next(); }
const DataLoaderOptions& DataLoader::config() const { return impl_->config(); }
int64_t DataLoader::global_batch_size() const { return impl_->global_batch_size(); }
int64_t DataLoader::epoch() const { return impl_->epoch(); }
int64_t DataLoader::skipped() const { return impl_->skipped(); }
nlohmann::json DataLoader::state() const { return impl_->state(); }
void DataLoader::load_state(const nlohmann::json& state) { impl_->load_state(state); }

}  // namespace titan::data
