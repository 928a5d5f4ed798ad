// SPDX-License-Identifier: BSD-3-Clause
// The strict backend: Gloo with NCCL's rules enforced, so that what would hang or mismatch on GPUs fails on
// CPU with a message naming the ranks and calls. Each rule is shown to catch what Gloo forgives, the
// pipeline's and the context-parallel ring's posting orders are shown to need the fixes they got, and a fault in
// expert parallelism's exchanges (ETP's all-gather and reduce-scatter swapped, an EP all-to-all skipped) is named.
// Every multi-rank test runs on this backend unless it says why not (docs/testing.md).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <mutex>
#include <numeric>
#include <regex>
#include <sstream>

#include "dist/launch_test_util.hpp"
#include "dist/rank_test_util.hpp"
#include "test_util.hpp"
#include "titan/dist/local_ranks.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/dist/process_group.hpp"
#include "titan/parallel/expert_parallel.hpp"
#include "titan/parallel/pipeline_schedule.hpp"

using namespace titan;

namespace {

// Short: the deadlock tests wait this long for a match that never comes.
constexpr auto kTimeout = std::chrono::seconds(3);

dist::ProcessGroup pair_group(const std::string& backend, int64_t rank, const dist::Store& store,
                              std::optional<c10::Device> device = std::nullopt) {
  return dist::ProcessGroup::create("pair", store, rank, 2, {0, 1},
                                    {.init_timeout = test::patience(std::chrono::seconds(60)),
                                     .timeout = kTimeout,
                                     .backend = backend,
                                     .device = device});
}

// Runs fn on two rank threads; returns each rank's error message ("(no error)" when none).
std::vector<std::string> on_two_ranks(const std::function<void(int64_t, const dist::Store&)>& fn) {
  std::vector<std::string> errors(2);
  std::mutex mutex;
  dist::run_local_ranks(2, [&](int64_t rank, const dist::Store& store) {
    const std::string e = test::error_of([&] { fn(rank, store); });
    std::lock_guard lock(mutex);
    errors[static_cast<size_t>(rank)] = e;
  });
  return errors;
}

// Both ranks receive from the other, then send to it: what the context-parallel ring did at cp 2.
void receive_then_send(const dist::ProcessGroup& g, bool batched) {
  const int64_t peer = 1 - g.rank();
  at::Tensor out = at::full({1024}, static_cast<double>(g.rank() + 1), at::kFloat);
  at::Tensor in = at::zeros({1024}, at::kFloat);
  if (batched) {
    g.batch_isend_irecv({{.send = false, .tensor = in, .peer = peer}, {.send = true, .tensor = out, .peer = peer}})
        .wait();
  } else {
    dist::Work recv = g.recv(in, peer, 0);
    dist::Work send = g.send(out, peer, 0);
    recv.wait();
    send.wait();
  }
  TITAN_CHECK(in[0].item<double>() == static_cast<double>(peer + 1), "received the wrong data");
}

}  // namespace

TEST_CASE("strict: two ranks that both receive first are a named deadlock, and batched they exchange",
          "[dist][strict]") {
  // Gloo forgives it (tagged, asynchronous point-to-point).
  for (const auto& e : on_two_ranks(
           [](int64_t rank, const dist::Store&store) { receive_then_send(pair_group("gloo", rank, store), false); }))
    CHECK(e == "(no error)");
  // NCCL would hang: each rank's send queues behind its receive, which waits for the other's send.
  const auto errors = on_two_ranks(
      [](int64_t rank, const dist::Store& store) { receive_then_send(pair_group("strict", rank, store), false); });
  for (int64_t rank = 0; rank < 2; ++rank) {
    INFO(errors[static_cast<size_t>(rank)]);
    CHECK_THAT(errors[static_cast<size_t>(rank)],
               Catch::Contains(fmt::format("rank {} (global {})'s recv #0 from rank {}", rank, rank, 1 - rank)) &&
                   Catch::Contains(fmt::format("is at recv #0 from rank {}", rank)) &&
                   Catch::Contains("batch_isend_irecv"));
  }
  // One batch: neither operation waits for the other.
  for (const auto& e : on_two_ranks(
           [](int64_t rank, const dist::Store&store) { receive_then_send(pair_group("strict", rank, store), true); }))
    CHECK(e == "(no error)");
}

TEST_CASE("strict: sends meet receives in posting order whatever the tags, and sizes must agree", "[dist][strict]") {
  // Rank 0 sends A (tag 1) then B (tag 2); rank 1 receives tag 2 first. Gloo matches by tag (B first),
  // NCCL by order (A first): the strict backend does what NCCL does.
  for (const std::string backend : {"gloo", "strict"}) {
    std::vector<double> first(1, 0.0);
    const auto errors = on_two_ranks([&](int64_t rank, const dist::Store& store) {
      const dist::ProcessGroup g = pair_group(backend, rank, store);
      if (rank == 0) {
        dist::Work a = g.send(at::full({4}, 1.0, at::kFloat), 1, 1);
        dist::Work b = g.send(at::full({4}, 2.0, at::kFloat), 1, 2);
        a.wait();
        b.wait();
      } else {
        at::Tensor x = at::zeros({4}, at::kFloat), y = at::zeros({4}, at::kFloat);
        dist::Work wx = g.recv(x, 0, 2);
        dist::Work wy = g.recv(y, 0, 1);
        wx.wait();
        wy.wait();
        first[0] = x[0].item<double>();
      }
    });
    INFO(backend << ": " << errors[0] << " / " << errors[1]);
    CHECK(errors == std::vector<std::string>{"(no error)", "(no error)"});
    CHECK(first[0] == (backend == "gloo" ? 2.0 : 1.0));
  }
  const auto errors = on_two_ranks([](int64_t rank, const dist::Store& store) {
    const dist::ProcessGroup g = pair_group("strict", rank, store);
    at::Tensor t = at::zeros({rank == 0 ? 4 : 8}, at::kFloat);
    (rank == 0 ? g.send(t, 1, 0) : g.recv(t, 0, 0)).wait();
  });
  CHECK_THAT(errors[1], Catch::Contains("recv #0 from rank 0") && Catch::Contains("got 4 x Float there") &&
                            Catch::Contains("as many elements"));
}

TEST_CASE("strict: a collective-order mismatch names both calls and ranks, and a missing one names the rank",
          "[dist][strict]") {
  const auto mismatch = on_two_ranks([](int64_t rank, const dist::Store& store) {
    const dist::ProcessGroup g = pair_group("strict", rank, store);
    at::Tensor t = at::ones({4}, at::kFloat);
    if (rank == 0) {
      g.all_reduce(t).wait();
    } else {
      at::Tensor out = at::zeros({8}, at::kFloat);
      g.all_gather(out, t).wait();
    }
  });
  for (int64_t rank = 0; rank < 2; ++rank) {
    INFO(mismatch[static_cast<size_t>(rank)]);
    CHECK_THAT(mismatch[static_cast<size_t>(rank)],
               Catch::Contains("collective #1") &&
                   Catch::Contains("rank 0 (global 0) issued all_reduce 4 x Float sum") &&
                   Catch::Contains("rank 1 (global 1) issued all_gather 4 x Float"));
  }
  const auto missing = on_two_ranks([](int64_t rank, const dist::Store& store) {
    const dist::ProcessGroup g = pair_group("strict", rank, store);
    at::Tensor t = at::ones({4}, at::kFloat);
    g.all_reduce(t).wait();
    if (rank == 0) g.broadcast(t, 0).wait();  // rank 1 skips it
  });
  CHECK_THAT(missing[0], Catch::Contains("collective #2, got none from rank 1 (global 1)") &&
                             Catch::Contains("broadcast 4 x Float root 0"));
  CHECK(missing[1] == "(no error)");
  // The same program on Gloo: rank 0's broadcast waits for the timeout with nothing to name.
}

TEST_CASE("strict: a device group refuses a CPU tensor, naming the group and the device", "[dist][strict]") {
  const auto errors = on_two_ranks([](int64_t rank, const dist::Store& store) {
    const dist::ProcessGroup g = pair_group("strict", rank, store, c10::Device(c10::kCUDA, 0));
    CHECK(g.device() == c10::Device(c10::kCUDA, 0));
    at::Tensor t = at::ones({4}, at::kFloat);
    g.all_reduce(t).wait();
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("all_reduce tensor on group 'pair' to be on the group's device cuda:0") &&
                      Catch::Contains("got Float (4) on cpu"));
  }
  CHECK(test::error_of([] {
          const dist::ProcessGroup one = dist::ProcessGroup::single("one");
          CHECK(one.device() == c10::Device(c10::kCPU));
        }) == "(no error)");
}

namespace {

// Posts a program's sends and receives on a pair group as the pipeline runtime does, in program order, and
// waits for all of them at the end (computes skipped: their data is not what is checked).
void replay_communication(const parallel::PipelineProgram& program, int64_t rank, const dist::ProcessGroup& g) {
  using Op = parallel::PipelineAction::Op;
  std::vector<std::pair<dist::Work, at::Tensor>> posted;
  for (const parallel::PipelineAction& a : program.actions[static_cast<size_t>(rank)]) {
    const bool send = a.op == Op::kSendForward || a.op == Op::kSendBackward;
    const bool recv = a.op == Op::kRecvForward || a.op == Op::kRecvBackward;
    if (!send && !recv) continue;
    at::Tensor t = at::zeros({4096}, at::kFloat);
    posted.emplace_back(send ? g.send(t, 1 - rank, 0) : g.recv(t, 1 - rank, 0), t);
  }
  for (auto& [work, tensor] : posted) work.wait();
}

// 1F1B on pp 2, 4 microbatches, communication placed as a Gloo runtime would: each send right after its
// compute, each receive right before the compute that needs it.
parallel::PipelineProgram one_f_one_b_unordered() {
  const std::vector<std::vector<std::string>> rows = {
      {"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0F2", "0SEND_F2", "0RECV_B1", "0B1", "0F3", "0SEND_F3",
       "0RECV_B2", "0B2", "0RECV_B3", "0B3"},
      {"1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1", "1RECV_F2", "1F2", "1B2", "1SEND_B2",
       "1RECV_F3", "1F3", "1B3", "1SEND_B3"}};
  parallel::PipelineProgram p{
      .name = "1F1B (Gloo order)", .num_ranks = 2, .num_stages = 2, .num_microbatches = 4, .stage_rank = {0, 1}};
  for (const auto& row : rows) {
    p.actions.emplace_back();
    for (const auto& cell : row) p.actions.back().push_back(parallel::parse_pipeline_action(cell));
  }
  return p;
}

}  // namespace

TEST_CASE("strict: 1F1B's sends and receives in Gloo's order hang under NCCL's rules, in the mirrored order they run",
          "[dist][strict][pipeline]") {
  const parallel::PipelineProgram unordered = one_f_one_b_unordered();
  // The validator knows the rule: rank 0 sends microbatch 1's activation while rank 1 sends microbatch 0's
  // gradient, each waiting for the other's receive.
  CHECK_THAT(test::error_of([&] { parallel::validate_pipeline_program(unordered); }),
             Catch::Contains("ranks 0 and 1 to post their sends and receives to each other in the same order") &&
                 Catch::Contains("operation #1 0SEND_F1 (step 3) against rank 1's 1SEND_B0 (step 3)"));
  const auto hung = on_two_ranks([&](int64_t rank, const dist::Store& store) {
    replay_communication(unordered, rank, pair_group("strict", rank, store));
  });
  CHECK_THAT(hung[0], Catch::Contains("send #1 to rank 1") && Catch::Contains("is at send #0 to rank 0"));
  // add_pipeline_communication places them so: each rank receives the gradient before sending the next
  // activation (PyTorch's 1F1B batches the two for the same reason).
  const parallel::PipelineProgram ordered = parallel::make_pipeline_program(PipelineSchedule::schedule_1f1b, 2, 2, 4);
  CHECK_NOTHROW(parallel::validate_pipeline_program(ordered));
  for (const auto& e : on_two_ranks([&](int64_t rank, const dist::Store&store) {
         replay_communication(ordered, rank, pair_group("strict", rank, store));
       }))
    CHECK(e == "(no error)");
}

TEST_CASE("every built-in schedule posts each pair's sends and receives in one order (NCCL's rule)",
          "[parallel][pipeline][strict]") {
  // every built-in schedule
  for (const PipelineSchedule schedule :
       {PipelineSchedule::gpipe, PipelineSchedule::schedule_1f1b, PipelineSchedule::interleaved_1f1b,
        PipelineSchedule::looped_bfs, PipelineSchedule::interleaved_zero_bubble, PipelineSchedule::zbv_zero_bubble,
        PipelineSchedule::dual_pipe_v}) {
    for (const int64_t pp : {2, 4, 8}) {
      const int64_t stages = parallel::is_single_stage(schedule) ? pp : 2 * pp;
      for (const int64_t microbatches : {stages, stages + pp, 2 * stages}) {
        INFO(fmt::format("{} pp {} microbatches {}", schedule, pp, microbatches));
        CHECK_NOTHROW(
            parallel::validate_pipeline_program(parallel::make_pipeline_program(schedule, pp, stages, microbatches)));
      }
    }
  }
}

namespace {

constexpr int64_t kWidth = 4;  // a slot's hidden size

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

std::vector<int64_t> values(const at::Tensor& t) {  // t (n) int64 CPU
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

// Expert tensor parallelism's exchanges over etp (the tp group) as the token dispatch issues them for one local
// expert (src/parallel/expert_parallel.cpp): the counts all-gathered, each rank's `rows` slots sent whole to every etp
// rank (the all-gather, of uneven parts), the partial outputs sent back to the rank that routed them and summed (the
// reduce-scatter). swapped: this rank issues the reduce-scatter before the all-gather. Returns the summed outputs.
at::Tensor etp_exchanges(const dist::ProcessGroup& etp, int64_t rows, bool swapped) {
  const int64_t n = etp.size();
  at::Tensor counts = at::full({1}, rows, at::kLong);  // (1)
  at::Tensor all_counts = at::empty({n}, at::kLong);   // (etp)
  etp.all_gather(all_counts, counts).wait();
  const std::vector<int64_t> theirs = values(all_counts), mine(static_cast<size_t>(n), rows);
  const at::Tensor slots = at::full({rows, kWidth}, static_cast<double>(etp.rank() + 1));  // (rows, D)
  const auto gather = [&] { return parallel::all_to_all_v(slots.repeat({n, 1}), etp, theirs, mine); };
  const auto scatter = [&](const at::Tensor& partial) {  // (sum theirs, D) -> (rows, D)
    return parallel::all_to_all_v(partial, etp, mine, theirs).view({n, rows, kWidth}).sum(0);
  };
  if (!swapped) return scatter(gather());
  at::Tensor early = scatter(at::ones({sum(theirs), kWidth}));
  gather();
  return early;
}

// Expert parallelism's exchanges over ep as the token dispatch issues them: the per-rank counts (an even all-to-all),
// the slots to the ranks of their experts and the experts' outputs back (all-to-alls with splits). to_each[s]: the
// slots this rank routes to rank s; the "experts" double them. skip_dispatch: this rank leaves out the slots' exchange.
at::Tensor ep_exchanges(const dist::ProcessGroup& ep, const std::vector<int64_t>& to_each, bool skip_dispatch) {
  at::Tensor send_counts = at::tensor(to_each, at::kLong);  // (ep)
  at::Tensor recv_counts = at::empty_like(send_counts);     // (ep)
  ep.all_to_all(recv_counts, send_counts).wait();
  const std::vector<int64_t> from_each = values(recv_counts);
  const at::Tensor slots = at::full({sum(to_each), kWidth}, static_cast<double>(ep.rank() + 1));  // (N, D)
  const at::Tensor routed = skip_dispatch ? at::zeros({sum(from_each), kWidth})
                                          : parallel::all_to_all_v(slots, ep, from_each, to_each);  // (M, D)
  return parallel::all_to_all_v(routed * 2, ep, to_each, from_each);                                // (N, D)
}

}  // namespace

TEST_CASE("strict: expert tensor parallelism's all-gather and reduce-scatter swapped on one rank are named",
          "[dist][strict][expert_parallel]") {
  // The two tp ranks route 3 and 5 slots; both exchanges move rows of the same width and dtype, so the order check
  // alone sees nothing: each rank's rows are held against what the other receives.
  for (const bool fault : {false, true}) {
    std::string group;  // its name: the mesh's group of those ranks
    const auto errors = on_two_ranks([&](int64_t rank, const dist::Store& store) {
      const dist::Mesh mesh({.tp = 2, .etp = 2}, rank, store, test::mesh_options(kTimeout));
      if (rank == 0) group = mesh.group("etp").name();
      const at::Tensor out = etp_exchanges(mesh.group("etp"), rank == 0 ? 3 : 5, fault && rank == 1);
      // Each rank's slots come back from both etp ranks: twice their value.
      TITAN_CHECK(at::equal(out, at::full_like(out, 2.0 * static_cast<double>(rank + 1))), "wrong sums");
    });
    INFO(errors[0] << "\n" << errors[1]);
    if (!fault) {
      CHECK(errors == std::vector<std::string>{"(no error)", "(no error)"});
      continue;
    }
    for (int64_t rank = 0; rank < 2; ++rank) {
      CHECK_THAT(errors[static_cast<size_t>(rank)],
                 Catch::Contains("group '" + group + "'") &&
                     Catch::Contains("collective #2 (all_to_all_v rows of 4 x Float)") &&
                     Catch::Contains(fmt::format("rank {} (global {}) sending 3 rows to rank {} (global {}), which "
                                                 "receives 5 from it",
                                                 rank, rank, 1 - rank, 1 - rank)));
    }
  }
}

TEST_CASE("strict: an expert-parallel all-to-all skipped on one rank is named", "[dist][strict][expert_parallel]") {
  // Rank 0 routes 1 slot to itself and 4 to rank 1, rank 1 2 to rank 0 and 3 to itself. Rank 1 skipping the slots'
  // exchange issues the outputs' exchange second: its rows are the dispatch's mirrored, which rank 0's do not match.
  for (const bool fault : {false, true}) {
    std::string group;
    const auto errors = on_two_ranks([&](int64_t rank, const dist::Store& store) {
      const dist::Mesh mesh({.dp_shard = 2, .ep = 2}, rank, store, test::mesh_options(kTimeout));
      if (rank == 0) group = mesh.group("ep").name();
      const std::vector<int64_t> to_each = rank == 0 ? std::vector<int64_t>{1, 4} : std::vector<int64_t>{2, 3};
      const at::Tensor out = ep_exchanges(mesh.group("ep"), to_each, fault && rank == 1);
      TITAN_CHECK(at::equal(out, at::full_like(out, 2.0 * static_cast<double>(rank + 1))), "wrong outputs");
    });
    INFO(errors[0] << "\n" << errors[1]);
    if (!fault) {
      CHECK(errors == std::vector<std::string>{"(no error)", "(no error)"});
      continue;
    }
    CHECK_THAT(errors[0], Catch::Contains("group '" + group + "'") &&
                              Catch::Contains("collective #2 (all_to_all_v rows of 4 x") &&
                              Catch::Contains("rank 0 (global 0) sending 4 rows to rank 1 (global 1), which receives "
                                              "2 from it"));
    CHECK_THAT(errors[1], Catch::Contains("group '" + group + "'") &&
                              Catch::Contains("collective #2 (all_to_all_v rows of 4 x") &&
                              Catch::Contains("rank 1 (global 1) sending 4 rows to rank 0 (global 0), which receives "
                                              "2 from it"));
  }
}

TEST_CASE("strict: a titan job the tests start over processes runs on the strict backend unless it names one",
          "[dist][strict][launch]") {
  const std::vector<std::string> job = {test::titan_run_path(),
                                        "--nproc-per-node",
                                        "2",
                                        "--",
                                        (test::binary_dir() / "bin" / "train_llama3").string(),
                                        "--training.steps",
                                        "1"};
  CHECK(test::strict_by_default(job) ==
        test::concat(job, {"--comm.backend", "strict", "--fault_tolerance.process_group", "strict"}));
  // An opt-out keeps its backend; one process, or a program that reads no JobConfig, is left alone.
  // plain Gloo: the opt-out itself, which this checks.
  const std::vector<std::string> gloo = test::concat(job, {"--comm.backend", "gloo"});
  CHECK(test::strict_by_default(gloo) == test::concat(gloo, {"--fault_tolerance.process_group", "strict"}));
  const std::vector<std::string> single(job.begin() + 4, job.end());
  CHECK(test::strict_by_default(single) == single);
  const std::vector<std::string> probe = {test::titan_run_path(), "--nproc-per-node", "2", "--",
                                          test::env_probe_path()};
  CHECK(test::strict_by_default(probe) == probe);
}

TEST_CASE("strict: the trainer under titan-run in a test says it runs on the strict backend",
          "[dist][strict][launch][train][full]") {
  test::TempDir dump;
  test::Subprocess run(test::fsdp2_debug_job(dump.path.string(), 1, {}), {{"TITAN_LOG_LEVEL", "info"}});
  test::require_exit(run, 0, 300);
  // Rank 0 logs the mesh (every rank builds it from the same flags): "[rank 0] ... Mesh dp_replicate(1) * ... = 2
  // (torchrun launch, strict backend)".
  INFO(run.output());
  CHECK(std::regex_search(run.output(), std::regex(R"(\[rank 0\] [^\n]*launch, strict backend\))")));
}
