// The agent's side of launch_sdk/exit_notice.h: a file of one slot per local rank, and a thread
// that waits (futex_waitv) on the slots of the workers it is told to watch. When a watched
// worker's holder thread exits, the kernel hands its robust mutex over before it frees the
// worker's memory; if the thread's exit status (already set then) says the worker fails, a
// notice is queued and fd() becomes readable, so that the group is stopped while the dead
// worker's memory is still being freed. A worker that exits with status 0, or a holder thread
// that ends alone, gives no notice: its reaping says how it ended.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "launch_sdk/exit_notice.h"

namespace launch {

class ExitNotices {
 public:
  struct Notice {
    int local_rank = 0;
    pid_t pid = -1;
    int status = 0;  // as waitpid(2) gives it; never 0
  };
  // futex_waitv takes 128 words: one for the thread's own wake-up, then up to two per rank.
  static constexpr int kMaxLocalRanks = 63;
  // The files it holds open: the slots' memfd and the eventfd.
  static constexpr int kFileCount = 2;
  static absl::StatusOr<std::unique_ptr<ExitNotices>> Create(int local_world_size);
  ~ExitNotices();
  ExitNotices(const ExitNotices&) = delete;
  ExitNotices& operator=(const ExitNotices&) = delete;

  // LAUNCH_EXIT_NOTICE for every local rank: "/proc/<pid>/fd/<n>".
  std::string EnvValue() const;
  // Readable while notices wait to be taken.
  int fd() const { return event_.get(); }
  // Watches `local_rank`'s slot for worker `pid` (in place of any earlier worker).
  void Watch(int local_rank, pid_t pid);
  // Watches nothing; notices not taken are dropped.
  void Clear();
  std::vector<Notice> Take();

 private:
  struct Watched {
    pid_t pid = 0;       // 0: not watched
    bool armed = false;  // waiting on the mutex word, with FUTEX_WAITERS set in it
    bool done = false;   // its holder is gone (or was never the worker's): nothing more to see
    uint32_t armed_word = 0;
    int32_t tid = 0;
  };
  ExitNotices() = default;
  // Makes a change under mu_, then has the thread look again.
  template <typename F>
  void Change(F change);
  // Under mu_: the notices queued, and the eventfd read empty.
  std::vector<Notice> TakeLocked();
  void Run();
  // Under mu_: arms the slot when its holder is the watched worker's thread; queues a notice when
  // that holder is gone with a failing status. Adds what to wait on to `waits` (struct futex_waitv, as bytes).
  void Look(int local_rank, std::vector<unsigned char>* waits);
  launch_sdk::ExitNoticeSlot* slot(int local_rank) const { return slots_ + local_rank; }

  UniqueFd file_, event_;
  launch_sdk::ExitNoticeSlot* slots_ = nullptr;
  size_t mapped_ = 0;
  std::mutex mu_;
  std::vector<Watched> watched_;
  std::vector<Notice> notices_;
  bool stop_ = false;
  uint32_t control_ = 0;  // a futex word of this process: bumped to make the thread look again
  std::thread thread_;
};

// The exit status the kernel has set for thread `tid` of process `pid` as it exits ("exit_code",
// field 52 of /proc/<pid>/task/<tid>/stat); nullopt when there is no such thread.
std::optional<int> ExitingThreadStatus(pid_t pid, pid_t tid);

}  // namespace launch
