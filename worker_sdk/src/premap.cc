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
std::map<std::string, Premapped>& Mappings() {              // under g_mu
  static auto* m = new std::map<std::string, Premapped>();  // never destroyed
  return *m;
}

void Release(const Premapped& m) {
  ::munmap(m.base, m.size);
  ::close(m.fd);
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
  const Premapped m{fd, base, size};
  if (!Mappings().emplace(path, m).second) Release(m);  // mapped already: keep the first
}

std::optional<Premapped> TakePremapped(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = Mappings().find(path);
  if (it == Mappings().end()) return std::nullopt;
  Premapped m = it->second;
  Mappings().erase(it);
  struct stat st {};
  if (::fstat(m.fd, &st) == 0 && static_cast<size_t>(st.st_size) == m.size) return m;
  Release(m);  // the file's size changed since: the taker maps it again whole
  return std::nullopt;
}

void DropPremapped(const std::string& path) {
  if (std::optional<Premapped> m = TakePremapped(path)) Release(*m);
}

void TouchPremapped() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& [path, m] : Mappings()) ReadEachPage(m.base, m.size);
}

}  // namespace launch_sdk::internal
