// SPDX-License-Identifier: BSD-3-Clause
// Data-loader benchmark: tokens/s of the loader alone (read + decode + tokenize + pack + batch) for
// several tokenizer worker counts, and the time next() waits per batch when the consumer spends
// --step-ms between batches (steady state: ~0 with enough workers). Run:
//   build/bin/bench_loader_throughput --data tests/assets/tinyshakespeare/input.txt
//       --tokenizer build/tests/assets/tokenizer --workers 0,1,2 --tokens 3000000
// (build/tests/assets/tokenizer is the tests' BPE, made by the build; or train one: build/bin/titan-tokenizer train)
// --data takes a file, folder or glob (.jsonl/.json[.gz|.zst] read as JSONL, anything else as text).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "titan/data/dataloader.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string data;
  std::string tokenizer;
  int64_t seq_len = 2048;
  int64_t batch = 8;
  std::vector<int64_t> workers = {0, 1, 2};
  int64_t tokens = 3'000'000;
  double step_ms = 0;  // simulated compute between batches
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--data")
      o.data = v;
    else if (k == "--tokenizer")
      o.tokenizer = v;
    else if (k == "--seq-len")
      o.seq_len = std::stoll(v);
    else if (k == "--batch")
      o.batch = std::stoll(v);
    else if (k == "--tokens")
      o.tokens = std::stoll(v);
    else if (k == "--step-ms")
      o.step_ms = std::stod(v);
    else if (k == "--workers") {
      o.workers.clear();
      for (size_t p = 0; p <= v.size();) {
        const size_t q = std::min(v.find(',', p), v.size());
        o.workers.push_back(std::stoll(v.substr(p, q - p)));
        p = q + 1;
      }
    } else {
      throw std::invalid_argument("unknown flag " + k);
    }
  }
  if (o.data.empty() || o.tokenizer.empty()) throw std::invalid_argument("--data and --tokenizer are required");
  return o;
}

titan::DatasetFormat format_of(const std::string& path) {
  const bool json = path.find(".jsonl") != std::string::npos || path.find(".json") != std::string::npos;
  return json ? titan::DatasetFormat::jsonl : titan::DatasetFormat::text;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const auto tok = titan::data::load_tokenizer(o.tokenizer);
    fmt::print("loader throughput: {} (tokenizer {}), batch {} x seq_len {}, {} hardware threads\n", o.data,
               o.tokenizer, o.batch, o.seq_len, std::thread::hardware_concurrency());
    for (int64_t workers : o.workers) {
      auto source = titan::data::open_source("bench", {.format = format_of(o.data), .path = o.data});
      titan::data::DataLoader loader(
          {{.source = source, .weight = 1.0}}, tok,
          {.local_batch_size = o.batch, .seq_len = o.seq_len, .num_workers = workers, .prefetch = 4});
      loader.next();  // warm-up: threads started, first batch made
      int64_t tokens = 0, batches = 0;
      double waited = 0;
      const auto start = Clock::now();
      while (tokens < o.tokens) {
        if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.step_ms));
        const auto t0 = Clock::now();
        const titan::data::Batch b = loader.next();
        waited += std::chrono::duration<double>(Clock::now() - t0).count();
        tokens += b.input.numel();
        ++batches;
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      fmt::print(
          "workers {:>2}: {:>6.2f} M tokens/s (loader only: {:>6.2f} M tokens/s of next() time), "
          "{:.3f} ms wait per batch over {} batches\n",
          workers, double(tokens) / seconds / 1e6, double(tokens) / waited / 1e6, 1e3 * waited / double(batches),
          batches);
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
