// SPDX-License-Identifier: BSD-3-Clause
// Text for SVG files (the pipeline timeline, titan-plot): one escaping rule for every writer.
#pragma once

#include <string>
#include <string_view>

namespace titan::detail {

/// `text` with &, <, > and " escaped; control characters (not allowed in XML 1.0) become '?'.
std::string xml_escape(std::string_view text);

}  // namespace titan::detail
