// Small string helpers shared by the launcher and the agent.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace launch {

// "a, b,,c" -> {"a", "b", "c"}: comma-separated items, trimmed, empty ones dropped.
inline std::vector<std::string> SplitCommaList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(p));
  }
  return out;
}

}  // namespace launch
