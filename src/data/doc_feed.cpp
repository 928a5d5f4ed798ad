// SPDX-License-Identifier: BSD-3-Clause
// DocFeed and its thread pool (see doc_feed.hpp).
#include "doc_feed.hpp"

namespace titan::data::detail {
namespace {

// Records per pool job: enough to amortise the hand-off, few enough to keep the read-ahead small.
constexpr size_t kChunkRecords = 32;

}  // namespace

TokenizedDoc tokenize_record(const Source& source, const Tokenizer& tokenizer, const StreamRecord& record, bool add_bos,
                             bool add_eos) {
  TokenizedDoc doc{.ids = {}, .flags = {}, .after = record.after, .skipped = false};
  const auto segments = source.decode(record.record);
  if (!segments) {
    doc.skipped = true;
    return doc;
  }
  if (segments->size() == 1 && segments->front().trainable) {
    doc.ids = tokenizer.encode(segments->front().text, add_bos, add_eos);
    doc.flags.assign(doc.ids.size(), kTrainable);
  } else {
    // Chat: segments are tokenized one by one so each token knows whether it is trained on; the
    // BOS/EOS framing is not (the assistant turns' end marker teaches the model to stop).
    const auto push = [&](int32_t id, uint8_t flags) {
      doc.ids.push_back(id);
      doc.flags.push_back(flags);
    };
    if (add_bos && tokenizer.bos_id()) push(*tokenizer.bos_id(), 0);
    for (const Segment& s : *segments) {
      for (int32_t id : tokenizer.encode(s.text)) push(id, s.trainable ? kTrainable : 0);
    }
    if (add_eos && tokenizer.eos_id()) push(*tokenizer.eos_id(), 0);
  }
  if (!doc.flags.empty()) doc.flags.front() |= kDocStart;
  return doc;
}

ThreadPool::ThreadPool(int64_t threads) {
  for (int64_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      while (true) {
        std::function<void()> job;
        {
          std::unique_lock lock(mutex_);
          ready_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
          if (jobs_.empty()) return;  // stopping and drained
          job = std::move(jobs_.front());
          jobs_.pop_front();
        }
        job();
      }
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::submit(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  ready_.notify_one();
}

DocFeed::DocFeed(DocumentStream& stream, std::shared_ptr<const Tokenizer> tokenizer, bool add_bos, bool add_eos,
                 int64_t num_workers)
    : stream_(stream), tokenizer_(std::move(tokenizer)), add_bos_(add_bos), add_eos_(add_eos) {
  if (num_workers > 0) {
    pool_ = std::make_unique<ThreadPool>(num_workers);
    max_in_flight_ = size_t(4 * num_workers);
  }
}

void DocFeed::refill() {
  while (!stream_done_ && in_flight_.size() < max_in_flight_) {
    std::vector<StreamRecord> records;
    StreamRecord r;
    while (records.size() < kChunkRecords) {
      if (!stream_.next(r)) {
        stream_done_ = true;
        break;
      }
      records.push_back(std::move(r));
    }
    if (records.empty()) break;
    std::vector<std::shared_ptr<Source>> sources;
    for (size_t i = 0; i < stream_.size(); ++i) sources.push_back(stream_.source_ptr(i));
    auto task = std::make_shared<std::packaged_task<Chunk()>>(
        [records = std::move(records), sources = std::move(sources), tok = tokenizer_, bos = add_bos_, eos = add_eos_] {
          Chunk out;
          out.reserve(records.size());
          for (const StreamRecord& rec : records) {
            out.push_back(tokenize_record(*sources[size_t(rec.source)], *tok, rec, bos, eos));
          }
          return out;
        });
    in_flight_.push_back(task->get_future());
    pool_->submit([task] { (*task)(); });
  }
}

bool DocFeed::next(TokenizedDoc& out) {
  if (!pool_) {
    StreamRecord r;
    if (!stream_.next(r)) return false;
    out = tokenize_record(stream_.source(size_t(r.source)), *tokenizer_, r, add_bos_, add_eos_);
    return true;
  }
  while (chunk_pos_ == chunk_.size()) {
    refill();
    if (in_flight_.empty()) return false;
    chunk_ = in_flight_.front().get();  // rethrows a worker's error here, in stream order
    in_flight_.pop_front();
    chunk_pos_ = 0;
    refill();
  }
  out = std::move(chunk_[chunk_pos_++]);
  return true;
}

void DocFeed::reset() {
  for (auto& f : in_flight_) f.wait();  // jobs read the sources' decode state; let them finish
  in_flight_.clear();
  chunk_.clear();
  chunk_pos_ = 0;
  stream_done_ = false;
}

}  // namespace titan::data::detail
