// SPDX-License-Identifier: BSD-3-Clause
// Catch2 (v2, as Debian ships it) entry point for titan_tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
