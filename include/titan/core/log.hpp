// SPDX-License-Identifier: BSD-3-Clause
// A thin logger over fmt: `[titan] HH:MM:SS I r0 message`. Only rank 0 logs unless `*_all` is used;
// the level comes from TITAN_LOG_LEVEL (debug|info|warn|error). Library code logs through this only.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace titan::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

/// The rank shown in the prefix and used for rank-0 filtering (set once by the launcher/mesh).
void set_rank(int rank);
int rank();
/// Minimum level printed; initialised from TITAN_LOG_LEVEL.
void set_level(Level level);
Level level();
/// Disable ANSI colors (metrics.disable_color_printing, or stdout not a terminal).
void set_color(bool enabled);
bool color();

namespace detail {
void write(Level level, bool all_ranks, std::string_view message);
}

template <class... T>
void debug(fmt::format_string<T...> f, T&&... args) {
  if (level() <= Level::debug) detail::write(Level::debug, false, fmt::format(f, std::forward<T>(args)...));
}
template <class... T>
void info(fmt::format_string<T...> f, T&&... args) {
  if (level() <= Level::info) detail::write(Level::info, false, fmt::format(f, std::forward<T>(args)...));
}
template <class... T>
void info_all(fmt::format_string<T...> f, T&&... args) {
  if (level() <= Level::info) detail::write(Level::info, true, fmt::format(f, std::forward<T>(args)...));
}
template <class... T>
void warn(fmt::format_string<T...> f, T&&... args) {
  if (level() <= Level::warn) detail::write(Level::warn, false, fmt::format(f, std::forward<T>(args)...));
}
template <class... T>
void error(fmt::format_string<T...> f, T&&... args) {
  detail::write(Level::error, true, fmt::format(f, std::forward<T>(args)...));
}

}  // namespace titan::log
