#include "library_pages.h"

#include <sys/mman.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace launch_sdk::internal {
namespace {

// "Key:   N kB" of an smaps field line: N, or -1 when the line is another key's.
long Field(const std::string& line, const char* key) {
  const size_t n = std::strlen(key);
  if (line.compare(0, n, key) != 0 || line.size() <= n || line[n] != ':') return -1;
  return std::strtol(line.c_str() + n + 1, nullptr, 10);
}

}  // namespace

bool IsLibraryMapping(const std::string& header) {
  std::istringstream in(header);
  std::string range, perms, offset, dev, inode, path;
  if (!(in >> range >> perms >> offset >> dev >> inode)) return false;
  std::getline(in >> std::ws, path);
  if (perms.size() != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' || inode == "0") return false;
  if (path.empty() || path[0] != '/' || path.find(" (deleted)") != std::string::npos) return false;
  const size_t slash = path.rfind('/');
  const std::string name = path.substr(slash + 1);
  return name.find(".so.") != std::string::npos || (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0);
}

size_t DropLibraryPages() {
  std::ifstream smaps("/proc/self/smaps");
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  std::string line;
  uintptr_t begin = 0, end = 0;
  bool candidate = false;  // the current mapping's, until one of its fields rules it out
  long dirty = -1;
  while (std::getline(smaps, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find(':') > line.find(' ')) {
      candidate = IsLibraryMapping(line);
      dirty = -1;
      if (candidate && std::sscanf(line.c_str(), "%zx-%zx", &begin, &end) != 2) candidate = false;
      continue;
    }
    if (!candidate) continue;
    if (long v = Field(line, "Private_Dirty"); v >= 0) {
      dirty = v;
    } else if (long a = Field(line, "Anonymous"); a >= 0) {
      // Both are known by now (Private_Dirty comes first): only a mapping with neither.
      if (dirty == 0 && a == 0 && end > begin) ranges.emplace_back(begin, end);
      candidate = false;
    }
  }
  size_t dropped = 0;
  for (const auto& [b, e] : ranges)
    if (::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED) == 0) dropped += e - b;
  return dropped;
}

}  // namespace launch_sdk::internal
