// SPDX-License-Identifier: BSD-3-Clause
#include "titan/core/test_faults.hpp"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <mutex>
#include <utility>

namespace titan::testing {
namespace {

constexpr const char* kSyntax =
    "kill=<rank>:<step>, hang=<rank>:<step>, skip_collective=<rank>:<n>, oom=<step>, ft_wait=<step>:<replicas> "
    "(repeatable), checkpoint_write_delay_ms=<ms>";

[[noreturn]] void bad_item(std::string_view item, std::string_view why) {
  throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                        fmt::format("[titan::testing::faults] expected TITAN_TEST_FAULTS items {}, got '{}' ({}). "
                                    "Fix or unset TITAN_TEST_FAULTS.",
                                    kSyntax, item, why));
}

int64_t number(std::string_view text, std::string_view item, int64_t min) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    bad_item(item, fmt::format("'{}' is not an integer", text));
  }
  if (value < min) bad_item(item, fmt::format("{} is below {}", value, min));
  return value;
}

// "<a>:<b>" with a >= min_a and b >= min_b.
std::pair<int64_t, int64_t> pair_of(std::string_view value, std::string_view item, int64_t min_a, int64_t min_b) {
  const size_t colon = value.find(':');
  if (colon == std::string_view::npos) bad_item(item, "expected two numbers joined by ':'");
  return {number(value.substr(0, colon), item, min_a), number(value.substr(colon + 1), item, min_b)};
}

struct Holder {
  std::mutex mutex;
  std::optional<Faults> faults;  // empty until the first faults() or set_faults
};

Holder& holder() {
  static Holder h;
  return h;
}

// With h.mutex held: TITAN_TEST_FAULTS is read the first time anyone asks.
Faults& loaded(Holder& h) {
  if (!h.faults) {
    const char* text = std::getenv("TITAN_TEST_FAULTS");
    h.faults = text == nullptr ? Faults{} : parse_faults(text);
  }
  return *h.faults;
}

}  // namespace

Faults parse_faults(std::string_view text) {
  Faults f;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) {
      if (comma == text.size()) break;  // a trailing comma or an empty variable
      bad_item(item, "an empty item");
    }
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) bad_item(item, "expected name=value");
    const std::string_view name = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    if (name == "kill" || name == "hang" || name == "skip_collective") {
      const auto [rank, at] = pair_of(value, item, 0, 1);
      (name == "kill" ? f.kill : name == "hang" ? f.hang : f.skip_collective) = RankAt{.rank = rank, .at = at};
    } else if (name == "oom") {
      f.oom_step = number(value, item, 1);
    } else if (name == "ft_wait") {
      const auto [step, replicas] = pair_of(value, item, 1, 1);
      f.ft_wait[step] = replicas;
    } else if (name == "checkpoint_write_delay_ms") {
      f.checkpoint_write_delay_ms = number(value, item, 0);
    } else {
      bad_item(item, fmt::format("unknown fault '{}'", name));
    }
  }
  return f;
}

Faults faults() {
  Holder& h = holder();
  const std::lock_guard lock(h.mutex);
  return loaded(h);
}

Faults set_faults(const Faults& faults) {
  Holder& h = holder();
  const std::lock_guard lock(h.mutex);
  Faults previous = loaded(h);
  h.faults = faults;
  return previous;
}

}  // namespace titan::testing
