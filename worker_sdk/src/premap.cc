#include "premap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "pages.h"

namespace launch_sdk::internal {
namespace {

std::mutex g_mu;
std::map<std::string, Premapped>& Mappings() {  // under g_mu
  static auto* m = new std::map<std::string, Premapped>();  // never destroyed
  return *m;
}

}  // namespace

void Premap(const std::string& path, size_t min_size) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<size_t>(st.st_size) > min_size)
    base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    ::close(fd);
    return;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  ReadEachPage(base, size);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!Mappings().emplace(path, Premapped{fd, base, size}).second) {  // mapped already: keep the first
    ::munmap(base, size);
    ::close(fd);
  }
}

std::optional<Premapped> TakePremapped(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Mappings().find(path);
  if (it == Mappings().end()) return std::nullopt;
  Premapped m = it->second;
  Mappings().erase(it);
  struct stat st {};
  if (::fstat(m.fd, &st) == 0 && static_cast<size_t>(st.st_size) == m.size) return m;
  ::munmap(m.base, m.size);  // the file's size changed since: the taker maps it again whole
  ::close(m.fd);
  return std::nullopt;
}

void DropPremapped(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Mappings().find(path);
  if (it == Mappings().end()) return;
  ::munmap(it->second.base, it->second.size);
  ::close(it->second.fd);
  Mappings().erase(it);
}

void TouchPremapped() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& [path, m] : Mappings()) ReadEachPage(m.base, m.size);
}

}  // namespace launch_sdk::internal
