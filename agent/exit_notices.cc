#include "agent/exit_notices.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "agent/worker_memory.h"
#include "common/limits.h"
#include "spdlog/spdlog.h"
#include "common/thread_name.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

namespace launch {
namespace {

static_assert(kMaxWorkersPerNode <= launch_sdk::kMaxLocalRanks,
              "every local rank of a node has a slot a worker can hold (launch_sdk/contract.h)");

struct WaitV {  // struct futex_waitv (linux/futex.h, Linux 5.16)
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kFutex32 = 2;         // FUTEX2_SIZE_U32
constexpr uint32_t kFutexPrivate = 128;  // FUTEX2_PRIVATE

void AddWait(std::vector<unsigned char>* waits, const uint32_t* word, uint32_t value, bool shared) {
  WaitV w{value, reinterpret_cast<uint64_t>(word), kFutex32 | (shared ? 0u : kFutexPrivate), 0};
  const auto* p = reinterpret_cast<const unsigned char*>(&w);
  waits->insert(waits->end(), p, p + sizeof w);
}

uint32_t* Word(launch_sdk::ExitNoticeSlot* s) { return reinterpret_cast<uint32_t*>(&s->mutex); }

}  // namespace

std::optional<int> ExitingThreadStatus(pid_t pid, pid_t tid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/task/", tid, "/stat"));
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  // The name (field 2) is in parentheses and may hold anything: fields go on after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> fields = absl::StrSplit(absl::string_view(line).substr(close + 1), ' ',
                                                         absl::SkipEmpty());
  constexpr size_t kExitCode = 52 - 3;  // fields[0] is field 3 (state)
  int status = 0;
  if (fields.size() <= kExitCode || !absl::SimpleAtoi(fields[kExitCode], &status)) return std::nullopt;
  return status;
}

absl::StatusOr<std::unique_ptr<ExitNotices>> ExitNotices::Create(int local_world_size) {
  if (local_world_size < 1 || local_world_size > kMaxLocalRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat(local_world_size, " local ranks: exit notices are kept for 1 to ", kMaxLocalRanks));
  }
  std::unique_ptr<ExitNotices> e(new ExitNotices());
  e->watched_.resize(static_cast<size_t>(local_world_size));
  auto file = MemoryFile("launch-exit-notice", MFD_ALLOW_SEALING);
  if (!file.ok()) return file.status();
  e->file_ = std::move(*file);
  e->mapped_ = static_cast<size_t>(local_world_size) * sizeof(launch_sdk::ExitNoticeSlot);
  // Sealed at its size: a worker opens it writable (/proc/<pid>/fd/<n>), and a file shrunk under
  // the agent's mapping would kill launch with SIGBUS at its next look.
  if (::ftruncate(e->file_.get(), static_cast<off_t>(e->mapped_)) != 0 ||
      ::fcntl(e->file_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::InternalError(absl::StrCat("sizing the exit notice file: ", std::strerror(errno)));
  }
  void* p = ::mmap(nullptr, e->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, e->file_.get(), 0);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap: ", std::strerror(errno)));
  e->slots_ = static_cast<launch_sdk::ExitNoticeSlot*>(p);
  e->event_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!e->event_.valid()) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  // futex_waitv refuses an empty list with EINVAL. Anything else (ENOSYS before Linux 5.16, EPERM
  // from a container's seccomp filter): no notices, workers are seen as they are reaped.
  if (::syscall(SYS_futex_waitv, nullptr, 0, 0, nullptr, 0) == 0 || errno != EINVAL) {
    return absl::UnimplementedError(absl::StrCat("futex_waitv (Linux 5.16) is not allowed: ", std::strerror(errno)));
  }
  // With every signal blocked: launch's signals are for its signalfd (a SIGCHLD taken by this
  // thread would never be seen there).
  sigset_t all, was;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &was);
  e->thread_ = std::thread([raw = e.get()] {
    NameThisThread("launch-notices");
    raw->Run();
  });
  pthread_sigmask(SIG_SETMASK, &was, nullptr);
  return e;
}

template <typename F>
void ExitNotices::Change(F change) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    change();
    __atomic_fetch_add(&control_, 1u, __ATOMIC_RELEASE);
  }
  ::syscall(SYS_futex, &control_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

ExitNotices::~ExitNotices() {
  Change([this] { stop_ = true; });
  if (thread_.joinable()) thread_.join();
  if (slots_) ::munmap(slots_, mapped_);
}

std::string ExitNotices::EnvValue() const { return WorkerPath(file_); }

void ExitNotices::Watch(int local_rank, pid_t pid) {
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= watched_.size()) return;
  Change([&] { watched_[local_rank] = Watched{pid}; });
}

void ExitNotices::Clear() {
  Change([this] {
    for (Watched& w : watched_) w = Watched{};
    TakeLocked();
  });
}

std::vector<ExitNotices::Notice> ExitNotices::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return TakeLocked();
}

std::vector<ExitNotices::Notice> ExitNotices::TakeLocked() {
  uint64_t count;
  while (::read(event_.get(), &count, sizeof count) > 0) {
  }
  std::vector<Notice> out;
  out.swap(notices_);
  return out;
}

void ExitNotices::Look(int r, std::vector<unsigned char>* waits) {
  Watched& w = watched_[r];
  if (w.pid <= 0 || w.done) return;
  launch_sdk::ExitNoticeSlot* s = slot(r);
  uint32_t* word = Word(s);
  // The holder is gone: handed over by the kernel (FUTEX_OWNER_DIED; a notice if its status says
  // the worker fails), or let go (0). Nothing more comes from this worker.
  auto gone = [&](uint32_t now, int32_t tid) {
    w.done = true;
    if (!(now & FUTEX_OWNER_DIED)) return;
    std::optional<int> status = ExitingThreadStatus(w.pid, tid);
    if (!status || *status == 0) return;
    notices_.push_back({r, w.pid, *status});
    const uint64_t one = 1;
    (void)!::write(event_.get(), &one, sizeof one);
  };
  if (w.armed) {
    const uint32_t now = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (now == w.armed_word) {
      AddWait(waits, word, now, true);
    } else {
      gone(now, w.tid);
    }
    return;
  }
  // Not armed yet. The worker sets tid, then pid, after it locks, and then bumps seq: a slot with
  // the watched pid is this worker's, and so is its tid.
  const uint32_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
  const int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
  const int32_t tid = __atomic_load_n(&s->tid, __ATOMIC_ACQUIRE);
  uint32_t now = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  if (pid != w.pid || tid <= 0) {
    AddWait(waits, &s->seq, seq, true);  // until it says it holds the slot
    return;
  }
  if ((now & FUTEX_TID_MASK) != static_cast<uint32_t>(tid)) {
    if (now & FUTEX_OWNER_DIED || now == 0) {
      gone(now, tid);  // it exited (or let go) before it was armed
    } else {
      AddWait(waits, &s->seq, seq, true);  // another holder's word: not this worker's slot now
    }
    return;
  }
  if (!ExitingThreadStatus(pid, tid)) {  // a thread id that is not the watched worker's
    w.done = true;
    return;
  }
  // FUTEX_WAITERS: the kernel wakes a waiter when it hands the mutex over (and glibc when the
  // worker unlocks it).
  const uint32_t want = now | FUTEX_WAITERS;
  if (now == want || __atomic_compare_exchange_n(word, &now, want, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    w.armed = true;
    w.armed_word = want;
    w.tid = tid;
    AddWait(waits, word, want, true);
    return;
  }
  // The word changed under us (the holder exited just now): look again at once.
  AddWait(waits, &control_, __atomic_load_n(&control_, __ATOMIC_ACQUIRE) + 1, false);
}

void ExitNotices::Run() {
  std::vector<unsigned char> waits;
  for (;;) {
    waits.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      AddWait(&waits, &control_, __atomic_load_n(&control_, __ATOMIC_ACQUIRE), false);
      for (size_t r = 0; r < watched_.size(); ++r) Look(static_cast<int>(r), &waits);
    }
    // Any word that no longer holds its value, or a wake-up on one, ends the wait: then look again.
    if (::syscall(SYS_futex_waitv, waits.data(), static_cast<unsigned>(waits.size() / sizeof(WaitV)), 0u, nullptr, 0) <
            0 &&
        errno != EAGAIN && errno != EINTR) {
      // Never spin: from here on workers are seen as they are reaped.
      spdlog::warn("exit notices stop: futex_waitv: {}", std::strerror(errno));
      return;
    }
  }
}

}  // namespace launch
