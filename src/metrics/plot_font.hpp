// SPDX-License-Identifier: BSD-3-Clause
// The plots' 5x7 bitmap font (plot_font.cpp); private to src/metrics/plot.cpp.
#pragma once

#include <cstdint>

namespace titan::plot::detail {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 7;
inline constexpr int kGlyphAdvance = 6;  ///< one column of space between glyphs

/// Whether pixel (col, row) of c's glyph is set; c without a glyph draws as '?'.
bool glyph_pixel(char c, int col, int row);

}  // namespace titan::plot::detail
