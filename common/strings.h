// Small string helpers shared by the launcher and the agent.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// A string from the wire as a log line or a message shows it: at most 64 bytes (an id may be the
// attack), with its length when cut.
inline constexpr size_t kMaxShownWireBytes = 64;
inline std::string Shown(const std::string& s) {
  return s.size() <= kMaxShownWireBytes ? s
                                        : absl::StrCat(s.substr(0, kMaxShownWireBytes), "...(", s.size(), " bytes)");
}

// "a, b, c and 7 more": a list in a log line or message, its length bounded whatever the list's.
inline constexpr size_t kMaxListedItems = 8;
inline std::string JoinSome(const std::vector<std::string>& items, size_t most = kMaxListedItems) {
  if (items.size() <= most) return absl::StrJoin(items, ", ");
  std::vector<std::string> first(items.begin(), items.begin() + most);
  return absl::StrCat(absl::StrJoin(first, ", "), " and ", items.size() - most, " more");
}

}  // namespace launch
