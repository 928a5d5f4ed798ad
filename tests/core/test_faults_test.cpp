// SPDX-License-Identifier: BSD-3-Clause
// The test-fault seam (core/test_faults.hpp): TITAN_TEST_FAULTS' syntax parses into the struct, a bad item is an
// error naming the variable and that item, and set_faults replaces the faults in force and hands back the old ones.
#include "titan/core/test_faults.hpp"

#include <string>

#include "test_util.hpp"

using Catch::Contains;
using titan::testing::Faults;
using titan::testing::parse_faults;

TEST_CASE("TITAN_TEST_FAULTS: every fault parses into its field", "[core][test_faults]") {
  const Faults f = parse_faults(
      "kill=1:3,hang=0:5,skip_collective=1:12,oom=2,ft_wait=1:2,ft_wait=12:3,checkpoint_write_delay_ms=500");
  REQUIRE(f.kill);
  CHECK(f.kill->rank == 1);
  CHECK(f.kill->at == 3);
  REQUIRE(f.hang);
  CHECK(f.hang->rank == 0);
  CHECK(f.hang->at == 5);
  REQUIRE(f.skip_collective);
  CHECK(f.skip_collective->rank == 1);
  CHECK(f.skip_collective->at == 12);
  CHECK(f.oom_step == 2);
  CHECK(f.ft_wait == std::map<int64_t, int64_t>{{1, 2}, {12, 3}});
  CHECK(f.checkpoint_write_delay_ms == 500);

  const Faults none = parse_faults("");
  CHECK_FALSE(none.kill);
  CHECK_FALSE(none.hang);
  CHECK_FALSE(none.skip_collective);
  CHECK_FALSE(none.oom_step);
  CHECK(none.ft_wait.empty());
  CHECK(none.checkpoint_write_delay_ms == 0);
  CHECK(parse_faults("oom=4,").oom_step == 4);  // a trailing comma is harmless
}

TEST_CASE("TITAN_TEST_FAULTS: a bad item is an error naming the variable and the item", "[core][test_faults]") {
  const std::pair<std::string, std::string> cases[] = {
      {"kill=1", "got 'kill=1' (expected two numbers joined by ':')"},
      {"oom=2,hang=x:3", "got 'hang=x:3' ('x' is not an integer)"},
      {"oom=2.5", "got 'oom=2.5' ('2.5' is not an integer)"},
      {"oom=0", "got 'oom=0' (0 is below 1)"},
      {"kill=-1:3", "got 'kill=-1:3' (-1 is below 0)"},
      {"ft_wait=1:2,,oom=3", "got '' (an empty item)"},
      {"crash=1:2", "got 'crash=1:2' (unknown fault 'crash')"},
      {"oom", "got 'oom' (expected name=value)"},
      {"checkpoint_write_delay_ms=", "got 'checkpoint_write_delay_ms=' ('' is not an integer)"},
  };
  for (const auto& [text, expected] : cases) {
    INFO(text);
    CHECK_THROWS_AS(parse_faults(text), c10::ValueError);
    CHECK_THROWS_WITH(parse_faults(text), Contains("[titan::testing::faults] expected TITAN_TEST_FAULTS items") &&
                                              Contains(expected) && Contains("Fix or unset TITAN_TEST_FAULTS"));
  }
}

TEST_CASE("set_faults replaces the faults in force and returns the previous ones", "[core][test_faults]") {
  const Faults original = titan::testing::set_faults({.oom_step = 7, .checkpoint_write_delay_ms = 3});
  CHECK(titan::testing::faults().oom_step == 7);
  CHECK(titan::testing::faults().checkpoint_write_delay_ms == 3);
  const Faults mine = titan::testing::set_faults(original);
  CHECK(mine.oom_step == 7);
  CHECK(titan::testing::faults().oom_step == original.oom_step);
}
