#include "library_pages.h"

#include <link.h>
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

namespace {

// "Key:   N kB" of an smaps field line: N, or -1 when the line is another key's.
long Field(const std::string& line, const char* key) {
  const size_t n = std::strlen(key);
  if (line.compare(0, n, key) != 0 || line.size() <= n || line[n] != ':') return -1;
  return std::strtol(line.c_str() + n + 1, nullptr, 10);
}

// The mappings DropLibraryPages drops, from /proc/self/smaps: those IsLibraryMapping takes whose
// fields say they hold no page of their own, resident (Private_Dirty, Anonymous) or swapped out
// (Swap: a relocated page on swap shows only there). A mapping missing any of the three is kept.
std::vector<std::pair<uintptr_t, uintptr_t>> CleanLibraryMappings() {
  std::ifstream smaps("/proc/self/smaps");
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  uintptr_t begin = 0, end = 0;
  bool candidate = false;
  int clean_fields = 0;  // of Private_Dirty, Anonymous and Swap, those seen at 0
  auto close_mapping = [&] {
    if (candidate && clean_fields == 3 && end > begin) ranges.emplace_back(begin, end);
    candidate = false;
  };
  for (std::string line; std::getline(smaps, line);) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) && line.find(':') > line.find(' ')) {
      close_mapping();
      candidate = IsLibraryMapping(line) && std::sscanf(line.c_str(), "%zx-%zx", &begin, &end) == 2;
      clean_fields = 0;
      continue;
    }
    if (!candidate) continue;
    for (const char* key : {"Private_Dirty", "Anonymous", "Swap"}) {
      const long v = Field(line, key);
      if (v > 0) candidate = false;
      if (v == 0) ++clean_fields;
    }
  }
  close_mapping();
  return ranges;
}

}  // namespace

size_t DropLibraryPages() {
  // Under the dynamic loader's lock (dl_iterate_phdr holds it while it calls back): no library is
  // loaded or unloaded, and no address range reused, between reading the mappings and dropping.
  size_t dropped = 0;
  ::dl_iterate_phdr(
      [](dl_phdr_info*, size_t, void* out) -> int {
        for (const auto& [b, e] : CleanLibraryMappings())
          if (::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED) == 0) *static_cast<size_t*>(out) += e - b;
        return 1;  // once
      },
      &dropped);
  return dropped;
}

}  // namespace launch_sdk::internal
