// SPDX-License-Identifier: BSD-3-Clause
// Private to src/data: tokenized documents in stream order. With workers, chunks of records are
// decoded and tokenized on a thread pool while earlier chunks are packed; results are consumed in
// submission order, so the output does not depend on the number of workers.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "packer.hpp"

namespace titan::data::detail {

/// Decodes and tokenizes one record; a skipped bad record gives a doc with `skipped` set.
TokenizedDoc tokenize_record(const Source& source, const Tokenizer& tokenizer, const StreamRecord& record, bool add_bos,
                             bool add_eos);

class ThreadPool {
 public:
  explicit ThreadPool(int64_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  void submit(std::function<void()> job);

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class DocFeed {
 public:
  DocFeed(DocumentStream& stream, std::shared_ptr<const Tokenizer> tokenizer, bool add_bos, bool add_eos,
          int64_t num_workers);

  /// The next document in stream order; false when a one-pass stream is over.
  bool next(TokenizedDoc& out);
  /// Drops everything read ahead (call before restoring the stream).
  void reset();

 private:
  using Chunk = std::vector<TokenizedDoc>;
  void refill();

  DocumentStream& stream_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  bool add_bos_, add_eos_;
  std::unique_ptr<ThreadPool> pool_;  // null: tokenize inline
  size_t max_in_flight_ = 0;
  std::deque<std::future<Chunk>> in_flight_;
  Chunk chunk_;
  size_t chunk_pos_ = 0;
  bool stream_done_ = false;
};

}  // namespace titan::data::detail
