#include "launch_sdk/exit_notice.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace launch_sdk {
namespace {

std::mutex g_mu;
ExitNoticeSlot* g_held = nullptr;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

bool HoldExitNotice(const std::string& path, int local_rank, std::string* why) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_held) return true;
  if (local_rank < 0 || local_rank >= kMaxLocalRanks) {
    *why = "local rank " + std::to_string(local_rank) + " is outside 0.." + std::to_string(kMaxLocalRanks - 1);
    return false;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *why = Errno("cannot open " + path);
    return false;
  }
  struct stat st {};
  const size_t end = (static_cast<size_t>(local_rank) + 1) * sizeof(ExitNoticeSlot);
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < end) {
    *why = path + " holds " + std::to_string(st.st_size) + " bytes: no slot for local rank " +
           std::to_string(local_rank);
    ::close(fd);
    return false;
  }
  void* base = ::mmap(nullptr, end, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    *why = Errno("cannot map " + path);
    return false;
  }
  auto* slot = static_cast<ExitNoticeSlot*>(base) + local_rank;
  // A slot held by a live process (this one's parent, whose environment a child inherited) is
  // left to it. A new slot's zeros, or a predecessor's mutex (its holder gone), are taken.
  const int held = pthread_mutex_trylock(&slot->mutex);
  if (held == EBUSY) {
    *why = "local rank " + std::to_string(local_rank) + "'s slot in " + path + " is held by process " +
           std::to_string(__atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE));
    ::munmap(base, end);
    return false;
  }
  if (held == EOWNERDEAD) pthread_mutex_consistent(&slot->mutex);
  if (held == 0 || held == EOWNERDEAD) pthread_mutex_unlock(&slot->mutex);
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  // Made anew (the agent only reads the word and sets FUTEX_WAITERS in it).
  int rc = pthread_mutex_init(&slot->mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc == 0) rc = pthread_mutex_lock(&slot->mutex);
  const auto tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  uint32_t word = 0;
  std::memcpy(&word, &slot->mutex, sizeof word);
  if (rc != 0 || (word & FUTEX_TID_MASK) != tid) {
    if (rc == 0) pthread_mutex_unlock(&slot->mutex);
    ::munmap(base, end);
    *why = rc != 0 ? std::string("cannot lock its mutex: ") + std::strerror(rc)
                   : "this C library's mutex does not begin with the kernel's robust futex word";
    return false;
  }
  // tid before pid: a slot that shows the watched pid shows its holder's tid too.
  __atomic_store_n(&slot->tid, static_cast<int32_t>(tid), __ATOMIC_RELEASE);
  __atomic_store_n(&slot->pid, static_cast<int32_t>(::getpid()), __ATOMIC_RELEASE);
  __atomic_fetch_add(&slot->seq, 1u, __ATOMIC_RELEASE);
  ::syscall(SYS_futex, &slot->seq, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);  // shared: the agent maps it too
  g_held = slot;
  return true;
}

bool HoldExitNoticeFromEnv(std::string* why) {
  const char* path = std::getenv(kExitNoticeEnv);
  const char* local = std::getenv("LOCAL_RANK");
  if (!path || !*path || !local || !*local) return false;
  char* end = nullptr;
  errno = 0;
  const long rank = std::strtol(local, &end, 10);
  if (errno != 0 || *end != '\0' || rank < 0 || rank >= kMaxLocalRanks) {
    *why = std::string("LOCAL_RANK '") + local + "' is not a local rank";
    return false;
  }
  return HoldExitNotice(path, static_cast<int>(rank), why);
}

bool HoldsExitNotice() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_held != nullptr;
}

}  // namespace launch_sdk
