// SPDX-License-Identifier: BSD-3-Clause
// The sharded format on synthetic shards: any grid of rectangles saved, any other grid loaded
// (bitwise); damaged files rejected naming the file and tensor; the Checkpointer's policy
// (keep_latest_k, load_step, newest broken checkpoint skipped, async staging, model-only export);
// AdamW's moments load across fp32 and bf16 (optimizer.implementation fused_opt_states_bf16).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/inotify.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <utility>

#include "test_util.hpp"
#include "titan/checkpoint/checkpoint.hpp"
#include "titan/checkpoint/checkpointer.hpp"
#include "titan/checkpoint/safetensors.hpp"
#include "titan/dist/mesh.hpp"
#include "titan/optim/adamw.hpp"

using namespace titan;
namespace fs = std::filesystem;

namespace {

// The rectangle [offset, offset + shape) of global as one rank's StateTensor.
checkpoint::StateTensor region(const std::string& key, const at::Tensor& global, std::vector<int64_t> offset,
                               std::vector<int64_t> shape) {
  at::Tensor local = global;
  for (size_t d = 0; d < shape.size(); ++d) local = local.narrow(static_cast<int64_t>(d), offset[d], shape[d]);
  checkpoint::StateTensor st;
  st.global_shape = global.sizes().vec();
  st.placements = {{"test", parallel::Placement::shard(0)}};
  st.offset = std::move(offset);
  st.local_shape = std::move(shape);
  st.key = key;
  st.tensor = local.clone();
  return st;
}

struct Saved {
  at::Tensor matrix = at::randn({7, 10});  // (7, 10) split 2 x 2, uneven
  at::Tensor cube = at::randn({4, 6, 5});  // (4, 6, 5) split on dim 1 in 4
  at::Tensor scalar = at::randn({});       // () on rank 0 only
};

// Four "ranks" write their parts of s, rank 0 commits: the path of a real save, minus the mesh.
void save_grid(const Saved& s, const fs::path& folder, int64_t step) {
  const fs::path tmp = folder.parent_path() / ".tmp-save";
  fs::create_directories(tmp);
  const int64_t rows[] = {0, 4, 7}, cols[] = {0, 5, 10}, planes[] = {0, 2, 3, 5, 6};
  for (int64_t r = 0; r < 4; ++r) {
    checkpoint::State part;
    part.tensors.push_back(region("model.matrix", s.matrix, {rows[r / 2], cols[r % 2]},
                                  {rows[r / 2 + 1] - rows[r / 2], cols[r % 2 + 1] - cols[r % 2]}));
    part.tensors.push_back(region("optimizer.cube", s.cube, {0, planes[r], 0}, {4, planes[r + 1] - planes[r], 5}));
    if (r == 0) {
      part.tensors.push_back(region("train_state.scalar", s.scalar, {}, {}));
      part.values["dataloader"] = {{"position", 42}};
    }
    checkpoint::write_rank_part(tmp, r, checkpoint::stage(part, at::kFloat));
  }
  REQUIRE(checkpoint::commit(tmp, folder, 4, step, 10.0));
}

// Loads folder onto the given rectangles (of matrix; cube and scalar whole) and checks them bitwise.
void check_load(const Saved& s, const fs::path& folder,
                const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& rects) {
  for (const auto& [offset, shape] : rects) {
    INFO("region at " << c10::str(at::IntArrayRef(offset)) << " of shape " << c10::str(at::IntArrayRef(shape)));
    checkpoint::State state;
    state.tensors.push_back(region("model.matrix", at::zeros({7, 10}), offset, shape));
    state.tensors.push_back(region("optimizer.cube", at::zeros({4, 6, 5}), {0, 0, 0}, {4, 6, 5}));
    state.tensors.push_back(region("train_state.scalar", at::zeros({}), {}, {}));
    const auto values = checkpoint::load(folder, state);
    at::Tensor want = s.matrix;
    for (size_t d = 0; d < 2; ++d) want = want.narrow(static_cast<int64_t>(d), offset[d], shape[d]);
    CHECK(at::equal(state.tensors[0].tensor, want));
    CHECK(at::equal(state.tensors[1].tensor, s.cube));
    CHECK(at::equal(state.tensors[2].tensor, s.scalar));
    CHECK(values.at("dataloader").at("position") == 42);
    CHECK(values.at("step") == 3);
  }
}

// Flips one byte of a file in place.
void flip_byte(const fs::path& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(offset);
  f.write(&c, 1);
}

// Trials per fuzz test: 1,000 in the full suite; scripts/slow_tests.sh sets TITAN_FUZZ_TRIALS=10000.
int fuzz_trials() {
  const char* value = std::getenv("TITAN_FUZZ_TRIALS");
  const int trials = value == nullptr ? 1000 : std::atoi(value);
  REQUIRE(trials >= 100);  // the refusal counts below are shares of the trials
  return trials;
}

}  // namespace

TEST_CASE("a checkpoint of 2-D shards loads bitwise onto any other rectangles", "[checkpoint]") {
  test::TempDir dir;
  at::manual_seed(0);
  const Saved s;
  const fs::path folder = dir.path / "step-3";
  save_grid(s, folder, 3);
  CHECK_FALSE(fs::exists(dir.path / ".tmp-save"));
  const auto index = titan::test::checkpoint_index(folder);
  CHECK(index.at("tensors").at("model.matrix").at("shards").size() == 4);
  CHECK(index.at("tensors").at("train_state.scalar").at("shards").size() == 1);
  CHECK(index.at("files").size() == 4);
  // Whole; row blocks across the saved row split; column blocks across the saved column split; one cell.
  check_load(
      s, folder,
      {{{0, 0}, {7, 10}}, {{0, 0}, {3, 10}}, {{3, 0}, {4, 10}}, {{0, 3}, {7, 4}}, {{2, 7}, {5, 3}}, {{4, 5}, {1, 1}}});
}

TEST_CASE("a dim-0 padded local shard loads with its padding zeroed", "[checkpoint]") {
  test::TempDir dir;
  const Saved s;
  save_grid(s, dir.path / "step-3", 3);
  checkpoint::State state;
  auto st = region("model.matrix", at::zeros({7, 10}), {4, 0}, {3, 10});
  st.tensor = at::full({4, 10}, 7.0f);  // FSDP pads the last shard to the others' row count
  state.tensors.push_back(st);
  checkpoint::load(dir.path / "step-3", state, {"optimizer", "train_state"});
  CHECK(at::equal(state.tensors[0].tensor.narrow(0, 0, 3), s.matrix.narrow(0, 4, 3)));
  CHECK(state.tensors[0].tensor[3].abs().sum().item<float>() == 0.0f);
}

TEST_CASE("a flipped byte a truncated file or a missing shard is an error naming it", "[checkpoint][integrity]") {
  test::TempDir dir;
  const Saved s;
  const fs::path folder = dir.path / "step-3";
  auto load_whole = [&] { check_load(s, folder, {{{0, 0}, {7, 10}}}); };

  SECTION("flipped byte") {
    save_grid(s, folder, 3);
    const auto shard = titan::test::checkpoint_index(folder).at("tensors").at("optimizer.cube").at("shards").at(2);
    flip_byte(folder / shard.at("file").get<std::string>(), shard.at("begin").get<int64_t>() + 5);
    CHECK_FALSE(checkpoint::check_complete(folder));  // sizes are intact: only the checksum can tell
    CHECK_THROWS_WITH(load_whole(), Catch::Contains("optimizer.cube") && Catch::Contains("rank-00002.safetensors") &&
                                        Catch::Contains("checksum"));
  }
  SECTION("truncated shard") {
    save_grid(s, folder, 3);
    fs::resize_file(folder / "rank-00001.safetensors", fs::file_size(folder / "rank-00001.safetensors") - 8);
    REQUIRE(checkpoint::check_complete(folder));
    CHECK_THAT(*checkpoint::check_complete(folder),
               Catch::Contains("rank-00001.safetensors") && Catch::Contains("truncated"));
    CHECK_THROWS_WITH(load_whole(), Catch::Contains("rank-00001.safetensors") && Catch::Contains("truncated"));
  }
  SECTION("missing shard") {
    save_grid(s, folder, 3);
    fs::remove(folder / "rank-00003.safetensors");
    CHECK_THROWS_WITH(load_whole(), Catch::Contains("rank-00003.safetensors") && Catch::Contains("missing"));
  }
  SECTION("missing index") {
    save_grid(s, folder, 3);
    fs::remove(folder / "index.json");
    CHECK_THROWS_WITH(load_whole(), Catch::Contains("no index.json"));
  }
  SECTION("an index naming a file outside the folder") {
    save_grid(s, folder, 3);
    // The shard really is there, one level up: following the name would read it silently.
    fs::copy_file(folder / "rank-00002.safetensors", dir.path / "rank-00002.safetensors");
    std::string index = test::read_file(folder / "index.json");
    for (size_t at = index.find("\"rank-00002"); at != std::string::npos; at = index.find("\"rank-00002", at + 4))
      index.replace(at, 1, "\"../");
    test::write_file(folder / "index.json", index);
    REQUIRE(checkpoint::check_complete(folder));
    CHECK_THAT(*checkpoint::check_complete(folder), Catch::Contains("../rank-00002.safetensors"));
    CHECK_THROWS_WITH(load_whole(), Catch::Contains("a file inside the checkpoint folder") &&
                                        Catch::Contains("files[\"../rank-00002.safetensors\"]") &&
                                        Catch::Contains("index.json"));
  }
}

TEST_CASE("a safetensors header one byte short is refused, not read shifted", "[checkpoint][integrity]") {
  test::TempDir dir;
  // {"a": 2 floats} with JSON padding after the object, as writers align the data section.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" + std::string(5, ' ');
  auto write = [&](uint64_t declared, const std::string& name = "t.safetensors") {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((declared >> (8 * i)) & 0xff);
    const float data[2] = {1.5f, -2.0f};
    bytes += header + std::string(reinterpret_cast<const char*>(data), sizeof(data));
    test::write_file(dir.path / name, bytes);
    return checkpoint::SafetensorsFile(dir.path / name);
  };
  const auto good = write(header.size(), "good.safetensors");
  CHECK(at::equal(good.read("a"), at::tensor({1.5f, -2.0f})));
  CHECK_THROWS_WITH(write(header.size() - 1), Catch::Contains("incomplete metadata"));
  // The reference reader (Python safetensors) refuses exactly this file too, and reads the good one.
  const fs::path verdict = dir.path / "verdict.json";
  REQUIRE(test::run_python("safetensors_verdicts.py", fmt::format("'{}' '{}'", dir.path.string(), verdict.string())) ==
          0);
  const auto python = nlohmann::json::parse(test::read_file(verdict));
  CHECK_THAT(python.at("t.safetensors").get<std::string>(),
             Catch::Contains("incomplete metadata, file not fully covered"));
  CHECK(python.at("good.safetensors") == "ok");
  CHECK_THROWS_WITH(write(header.size() + 1), Catch::Contains("t.safetensors"));  // one byte short of data
  // A header length past the reference reader's 100 MB is refused before anything is allocated.
  CHECK_THROWS_WITH(write(uint64_t{1} << 40),
                    Catch::Contains("at most 100000000 bytes") && Catch::Contains("t.safetensors"));
}

TEST_CASE("1,000 corrupted safetensors files are read or refused, never crash", "[checkpoint][integrity][fuzz][full]") {
  test::TempDir dir;
  at::manual_seed(0);
  const fs::path clean = dir.path / "clean.safetensors", cases = dir.path / "cases";
  fs::create_directories(cases);
  std::map<std::string, std::string> verdicts;  // file -> "ok" or titan's error
  checkpoint::write_safetensors(
      clean, {{"w", at::randn({4, 8})}, {"ids", at::arange(6, at::kLong)}, {"half", at::ones({3}, at::kBFloat16)}});
  const std::string original = test::read_file(clean);
  std::mt19937_64 rng(20261201);
  int64_t refused = 0, read = 0;
  const int trials = fuzz_trials();
  for (int trial = 0; trial < trials; ++trial) {
    std::string bytes = original;
    switch (trial % 4) {
      case 0:  // a flipped byte anywhere
        bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 1:  // truncated
        bytes.resize(rng() % bytes.size());
        break;
      case 2: {                    // a digit of the header (a length, a shape, an offset) changed
        uint64_t header_size = 0;  // the little-endian length in the first 8 bytes
        for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<unsigned char>(bytes[i]);
        std::vector<size_t> digits;
        for (size_t i = 8; i < 8 + header_size; ++i) {
          if (std::isdigit(static_cast<unsigned char>(bytes[i]))) digits.push_back(i);
        }
        REQUIRE(!digits.empty());
        bytes[digits[rng() % digits.size()]] = static_cast<char>('0' + rng() % 10);
        break;
      }
      default:  // the header length's low byte changed
        bytes[0] = static_cast<char>(static_cast<unsigned char>(bytes[0]) + static_cast<int>(rng() % 17) - 8);
        break;
    }
    const std::string name = fmt::format("{:04d}.safetensors", trial);
    test::write_file(cases / name, bytes);
    try {
      const checkpoint::SafetensorsFile file(cases / name);
      for (const auto& [tensor, entry] : file.entries()) {
        const at::Tensor t = file.read(tensor);
        REQUIRE(t.sizes().vec() == entry.shape);  // whatever is accepted is read exactly as declared
      }
      verdicts[name] = "ok";
      ++read;
    } catch (const c10::Error& e) {  // anything else (a JSON library error, std::out_of_range) fails the test
      verdicts[name] = e.what_without_backtrace();
      ++refused;
    }
  }
  // Flips in the data section are the checksum's business (checkpoint::load); header damage is refused here.
  CHECK(read > 0);
  CHECK(refused > trials * 3 / 10);
  // As strict as the reference reader and no stricter: Python safetensors accepts exactly the same files.
  const fs::path reference = dir.path / "reference.json";
  REQUIRE(test::run_python("safetensors_verdicts.py", fmt::format("'{}' '{}'", cases.string(), reference.string())) ==
          0);
  const auto python = nlohmann::json::parse(test::read_file(reference));
  REQUIRE(python.size() == verdicts.size());
  int64_t disagree = 0;
  for (const auto& [name, titan_verdict] : verdicts) {
    const std::string python_verdict = python.at(name).get<std::string>();
    if ((titan_verdict == "ok") != (python_verdict == "ok")) {
      UNSCOPED_INFO(name << ": titan " << titan_verdict << " | python " << python_verdict);
      ++disagree;
    }
  }
  CHECK(disagree == 0);
}

namespace {

// Every JSON value of j (objects' and arrays' members too), as pointers into it.
void collect_values(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
                    std::vector<nlohmann::json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) collect_values(value, at / key, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) collect_values(j[i], at / i, out);
  }
}

// Files opened in watched folders, through inotify: what the loader opened outside its checkpoint folder.
class OpenWatch {
 public:
  explicit OpenWatch(const std::vector<fs::path>& folders) : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    for (const auto& f : folders) watches_ += inotify_add_watch(fd_, f.c_str(), IN_OPEN | IN_ACCESS) >= 0 ? 1 : 0;
  }
  ~OpenWatch() { ::close(fd_); }
  bool ok() const { return fd_ >= 0 && watches_ > 0; }
  // The names of files (not folders) opened or read since the last call.
  std::vector<std::string> drain() {
    std::vector<std::string> names;
    alignas(inotify_event) char buf[4096];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof(buf))) > 0;) {
      for (char* p = buf; p < buf + n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(p);
        if ((e->mask & IN_ISDIR) == 0) names.push_back(e->len > 0 ? std::string(e->name) : std::string("(watched)"));
        p += sizeof(inotify_event) + e->len;
      }
    }
    return names;
  }

 private:
  int fd_ = -1;
  int watches_ = 0;
};

}  // namespace

TEST_CASE("1,000 corrupted checkpoints load or are refused, never crash or open a file outside their folder",
          "[checkpoint][integrity][fuzz]") {
  test::TempDir dir;
  at::manual_seed(0);
  const Saved s;
  // root/outside/step-3 is the checkpoint; root and root/outside hold sentinels an escaping name would reach.
  const fs::path outside = dir.path / "outside", folder = outside / "step-3";
  fs::create_directories(outside);
  save_grid(s, folder, 3);
  std::map<std::string, std::string> pristine;  // file name -> bytes
  for (const auto& e : fs::directory_iterator(folder))
    pristine[e.path().filename().string()] = test::read_file(e.path());
  REQUIRE(pristine.size() == 5);  // index.json + 4 shards
  for (const auto& [name, bytes] : pristine) {
    test::write_file(outside / name, bytes);
    test::write_file(dir.path / name, bytes);
  }
  const std::vector<std::string> shards = {"rank-00000.safetensors", "rank-00001.safetensors", "rank-00002.safetensors",
                                           "rank-00003.safetensors"};
  // Names that leave the folder (each would find a valid copy of the shard there), and other odd values.
  const std::vector<nlohmann::json> hostile = {"../rank-00000.safetensors",
                                               "../../rank-00001.safetensors",
                                               (outside / "rank-00002.safetensors").string(),
                                               "./rank-00003.safetensors",
                                               "rank-00000.safetensors/..",
                                               "..",
                                               ".",
                                               "",
                                               "step-3/../rank-00000.safetensors",
                                               -1,
                                               0,
                                               1,
                                               7,
                                               4096,
                                               int64_t{1} << 62,
                                               uint64_t{18446744073709551615ull},
                                               1e300,
                                               2.5,
                                               "",
                                               nullptr,
                                               true,
                                               nlohmann::json::array(),
                                               nlohmann::json::object(),
                                               nlohmann::json::array({0, 0}),
                                               nlohmann::json::array({-1}),
                                               nlohmann::json::array({int64_t{1} << 40, 1})};
  OpenWatch watch({dir.path, outside});
  REQUIRE(watch.ok());
  std::mt19937_64 rng(20261201);
  int64_t loaded = 0, refused = 0;
  std::vector<std::string> escapes, unclear;
  const int trials = fuzz_trials();
  for (int trial = 0; trial < trials; ++trial) {
    for (const auto& [name, bytes] : pristine) test::write_file(folder / name, bytes);
    const std::string& shard = shards[rng() % shards.size()];
    std::string index = pristine.at("index.json");
    std::string what;
    switch (trial % 6) {
      case 0: {  // a flipped byte of the index
        const size_t at = rng() % index.size();
        index[at] ^= static_cast<char>(1 + rng() % 255);
        what = fmt::format("index byte {} flipped", at);
        break;
      }
      case 1:  // the index truncated
        index.resize(rng() % index.size());
        what = fmt::format("index cut to {} bytes", index.size());
        break;
      case 2: {  // one JSON value of the index replaced
        nlohmann::json j = nlohmann::json::parse(index);
        std::vector<nlohmann::json::json_pointer> at;
        collect_values(j, nlohmann::json::json_pointer(), at);
        const auto& ptr = at[1 + rng() % (at.size() - 1)];
        const auto& value = hostile[rng() % hostile.size()];
        j[ptr] = j[ptr].is_number_integer() && rng() % 3 == 0 ? nlohmann::json(j[ptr].get<int64_t>() + 1) : value;
        index = j.dump();
        what = fmt::format("{} = {}", ptr.to_string(), j[ptr].dump());
        break;
      }
      case 3: {  // a shard renamed consistently (its "files" key and every "file") to a name outside the folder
        const std::string to = hostile[rng() % 9].get<std::string>();
        for (size_t at = index.find('"' + shard + '"'); at != std::string::npos;
             at = index.find('"' + shard + '"', at + to.size() + 2)) {
          index.replace(at + 1, shard.size(), to);
        }
        what = fmt::format("{} renamed '{}'", shard, to);
        break;
      }
      case 4: {  // a flipped byte of a shard
        std::string bytes = pristine.at(shard);
        const size_t at = rng() % bytes.size();
        bytes[at] ^= static_cast<char>(1 + rng() % 255);
        test::write_file(folder / shard, bytes);
        what = fmt::format("{} byte {} flipped", shard, at);
        break;
      }
      default: {  // a shard truncated, or its header length changed
        std::string bytes = pristine.at(shard);
        if (rng() % 2 == 0) {
          bytes.resize(rng() % bytes.size());
        } else {
          bytes[0] = static_cast<char>(static_cast<unsigned char>(bytes[0]) + static_cast<int>(rng() % 17) - 8);
        }
        test::write_file(folder / shard, bytes);
        what = fmt::format("{} cut or its header length changed", shard);
        break;
      }
    }
    test::write_file(folder / "index.json", index);
    checkpoint::State state;
    state.tensors.push_back(region("model.matrix", at::zeros({7, 10}), {0, 0}, {7, 10}));
    state.tensors.push_back(region("optimizer.cube", at::zeros({4, 6, 5}), {0, 0, 0}, {4, 6, 5}));
    state.tensors.push_back(region("train_state.scalar", at::zeros({}), {}, {}));
    try {
      (void)checkpoint::check_complete(folder);  // a verdict, never a throw
      checkpoint::load(folder, state);
      ++loaded;
    } catch (const c10::Error& e) {
      // A clear refusal names titan's check; any other exception type escapes and fails the test.
      if (std::string(e.what_without_backtrace()).find("[titan::") == std::string::npos) {
        unclear.push_back(what + ": " + e.what_without_backtrace());
      }
      ++refused;
    }
    for (const auto& name : watch.drain()) escapes.push_back(fmt::format("trial {} ({}) opened {}", trial, what, name));
  }
  INFO(fmt::format("{}", fmt::join(escapes, "\n")));
  CHECK(escapes.empty());
  INFO(fmt::format("{}", fmt::join(unclear, "\n")));
  CHECK(unclear.empty());
  CHECK(loaded > 0);  // damage that misses (a flipped byte of padding, of a value) loads
  CHECK(refused > trials / 2);
  // The watch does see opens: reading a sentinel ourselves is reported.
  (void)test::read_file(outside / "rank-00000.safetensors");
  const auto seen = watch.drain();
  CHECK(!seen.empty());
  CHECK(std::count(seen.begin(), seen.end(), "rank-00000.safetensors") == static_cast<int64_t>(seen.size()));
}

namespace {

CheckpointConfig policy(int64_t keep, titan::AsyncMode async_mode) {
  CheckpointConfig c;
  c.enable = true;
  c.interval = 1;
  c.keep_latest_k = keep;
  c.async_mode = async_mode;
  return c;
}

// A one-process training state: a "model" weight, an optimizer moment and the loader's position.
struct ToyState {
  at::Tensor weight = at::zeros({300, 1000});  // (300, 1000): 1.2 MB, more than one checksum chunk
  at::Tensor moment = at::zeros({300, 1000});
  int64_t position = 0;
  checkpoint::State state() {
    checkpoint::State s;
    s.tensors.push_back(checkpoint::state_tensor("model.weight", weight, nullptr));
    s.tensors.push_back(checkpoint::state_tensor("optimizer.weight.exp_avg", moment, nullptr));
    s.values["dataloader"] = {{"position", position}};
    return s;
  }
  void set(int64_t step) {
    weight.fill_(static_cast<float>(step));
    moment.fill_(static_cast<float>(-step));
    position = 10 * step;
  }
};

}  // namespace

TEST_CASE("the checkpointer keeps the newest k and loads the latest complete or load_step", "[checkpoint][policy]") {
  test::TempDir dir;
  const dist::Mesh mesh;
  const titan::AsyncMode mode = GENERATE(titan::AsyncMode::disabled, titan::AsyncMode::async);
  INFO(fmt::format("async_mode {}", mode));
  ToyState toy;
  {
    checkpoint::Checkpointer saver(policy(2, mode), dir.path, mesh);
    for (int64_t step = 1; step <= 4; ++step) {
      toy.set(step);
      saver.save(step, toy.state(), /*last=*/false);
      toy.set(100 + step);  // training goes on while an async save is written: the save holds `step`
    }
    saver.wait();
  }
  const auto steps = checkpoint::list_steps(dir.path / "checkpoint");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].first == 4);
  CHECK(steps[1].first == 3);

  auto load_with = [&](CheckpointConfig c) {
    ToyState into;
    checkpoint::State state = into.state();
    auto values = checkpoint::Checkpointer(c, dir.path, mesh).load(state);
    REQUIRE(values);
    CHECK(into.weight.mean().item<float>() == -into.moment.mean().item<float>());
    CHECK(values->at("dataloader").at("position") == 10 * values->at("step").get<int64_t>());
    CHECK(into.weight.mean().item<float>() == static_cast<float>(values->at("step").get<int64_t>()));
    return values->at("step").get<int64_t>();
  };
  CHECK(load_with(policy(2, mode)) == 4);
  CheckpointConfig at3 = policy(2, mode);
  at3.load_step = 3;
  CHECK(load_with(at3) == 3);

  // The newest is broken (an interrupted save leaves no index): the previous one loads.
  fs::remove(dir.path / "checkpoint" / "step-4" / "index.json");
  fs::create_directories(dir.path / "checkpoint" / ".step-5.tmp");
  CHECK(load_with(policy(2, mode)) == 3);
  CheckpointConfig at4 = policy(2, mode);
  at4.load_step = 4;
  CHECK_THROWS_WITH(load_with(at4), Catch::Contains("load_step 4") && Catch::Contains("no index.json"));
}

TEST_CASE("the last save holds the model only in export_dtype", "[checkpoint][policy]") {
  test::TempDir dir;
  const dist::Mesh mesh;
  CheckpointConfig c = policy(0, titan::AsyncMode::async);
  c.export_dtype = titan::DType::bfloat16;
  ToyState toy;
  toy.set(3);
  checkpoint::Checkpointer(c, dir.path, mesh).save(3, toy.state(), /*last=*/true);
  const fs::path folder = dir.path / "checkpoint" / "step-3";
  const auto index = titan::test::checkpoint_index(folder);
  CHECK(index.at("tensors").size() == 1);
  CHECK(index.at("tensors").at("model.weight").at("dtype") == "BF16");
  ToyState into;
  checkpoint::State state = into.state();
  const auto values = checkpoint::load(folder, state);
  CHECK(values.at("skipped") == nlohmann::json::array({"optimizer"}));
  CHECK(at::equal(into.weight, toy.weight));  // 3.0 is exact in bfloat16
  CHECK(into.moment.abs().sum().item<float>() == 0.0f);
}

TEST_CASE("exclude_from_loading leaves the excluded groups untouched", "[checkpoint][policy]") {
  test::TempDir dir;
  const dist::Mesh mesh;
  ToyState toy;
  toy.set(5);
  checkpoint::Checkpointer(policy(0, titan::AsyncMode::disabled), dir.path, mesh).save(5, toy.state(), /*last=*/false);
  CheckpointConfig c = policy(0, titan::AsyncMode::disabled);
  c.exclude_from_loading = {"optimizer", "dataloader"};
  ToyState into;
  checkpoint::State state = into.state();
  const auto values = checkpoint::Checkpointer(c, dir.path, mesh).load(state);
  REQUIRE(values);
  CHECK(at::equal(into.weight, toy.weight));
  CHECK(into.moment.abs().sum().item<float>() == 0.0f);
  CHECK_FALSE(values->contains("dataloader"));
}

namespace {

// Two parameters (a matrix and a vector) and an AdamW over them after `steps` steps of random gradients.
struct Trained {
  std::vector<at::Tensor> params;
  std::unique_ptr<titan::AdamW> opt;
};

Trained trained(titan::OptimizerImplementation impl, int steps) {
  at::manual_seed(7);
  Trained t;
  t.params = {at::randn({6, 5}).requires_grad_(), at::randn({33}).requires_grad_()};
  t.opt = std::make_unique<titan::AdamW>(t.params, titan::OptimizerConfig{.implementation = impl});
  for (int s = 0; s < steps; ++s) {
    for (auto& p : t.params) p.mutable_grad() = at::randn_like(p);
    t.opt->step(1e-2);
  }
  return t;
}

checkpoint::State model_and_optimizer(const Trained& t) {
  checkpoint::State s;
  checkpoint::add_model(s, {"w", "b"}, t.params, nullptr);
  checkpoint::add_optimizer(s, {"w", "b"}, *t.opt, nullptr);
  return s;
}

// One process's save, as save_grid does it (no mesh).
void save_one(const Trained& t, const fs::path& folder) {
  const fs::path tmp = folder.parent_path() / ".tmp-save";
  fs::create_directories(tmp);
  checkpoint::write_rank_part(tmp, 0, checkpoint::stage(model_and_optimizer(t), at::kFloat));
  REQUIRE(checkpoint::commit(tmp, folder, 1, 3, 10.0));
}

}  // namespace

TEST_CASE("AdamW moments load across fp32 and bf16 (fused_opt_states_bf16) checkpoints", "[checkpoint][optim]") {
  using titan::OptimizerImplementation;
  test::TempDir dir;
  const Trained fp32 = trained(OptimizerImplementation::fused, 3);
  const Trained bf16 = trained(OptimizerImplementation::fused_opt_states_bf16, 3);
  save_one(fp32, dir.path / "fp32");
  save_one(bf16, dir.path / "bf16");
  // Each saves its moments in its own dtype.
  CHECK(titan::test::checkpoint_index(dir.path / "fp32").at("tensors").at("optimizer.w.exp_avg").at("dtype") == "F32");
  CHECK(titan::test::checkpoint_index(dir.path / "bf16").at("tensors").at("optimizer.w.exp_avg").at("dtype") == "BF16");
  CHECK(titan::test::checkpoint_index(dir.path / "bf16").at("tensors").at("optimizer.w.step").at("dtype") == "F32");
  // The loader copies into the optimizer's own tensors, which keep their dtype: fp32 moments round to
  // nearest even (as Tensor::to), bf16 ones widen exactly.
  for (const auto& [from, to] : {std::pair{"fp32", OptimizerImplementation::fused_opt_states_bf16},
                                 std::pair{"bf16", OptimizerImplementation::fused}}) {
    INFO(fmt::format("{} checkpoint into {}", from, to));
    const Trained& saved = std::string(from) == "fp32" ? fp32 : bf16;
    const at::ScalarType moment_dtype = to == OptimizerImplementation::fused ? at::kFloat : at::kBFloat16;
    Trained into = trained(to, 0);
    checkpoint::State state = model_and_optimizer(into);
    checkpoint::load(dir.path / from, state);
    for (size_t i = 0; i < into.params.size(); ++i) {
      CHECK(at::equal(into.params[i], saved.params[i]));
      const auto got = into.opt->state(i);
      const auto want = saved.opt->state(i);
      for (size_t k = 0; k < 2; ++k) {
        CHECK(got[k].tensor.scalar_type() == moment_dtype);
        CHECK(at::equal(got[k].tensor, want[k].tensor.to(moment_dtype)));
      }
      CHECK(got[2].tensor.item<double>() == 3.0);  // the step counter
    }
    // Training goes on from the loaded state.
    for (auto& p : into.params) p.mutable_grad() = at::ones_like(p);
    into.opt->step(1e-2);
    CHECK(into.opt->state(0)[2].tensor.item<double>() == 4.0);
    CHECK(into.opt->state(0)[0].tensor.scalar_type() == moment_dtype);
  }
}
