// A worker's notice to its agent that it is exiting, given by the kernel before it tears down the
// worker's memory. A process's exit frees its memory before its parent can reap it: about 10 ms
// for a LibTorch worker here, during which the agent would not yet know of the death. A worker
// that holds a robust, process-shared mutex in a file the agent maps hands it over as it exits
// (the kernel walks the thread's robust-futex list before it drops the memory): the agent's
// waiter is woken with FUTEX_OWNER_DIED, reads the exit status the kernel has set already
// (/proc/<pid>/task/<tid>/stat), and stops the other workers while the kernel still frees the
// dead one's memory.
//
// The file (LAUNCH_EXIT_NOTICE=/proc/<agent pid>/fd/<n>) holds one ExitNoticeSlot per local rank.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace launch_sdk {

inline constexpr char kExitNoticeEnv[] = "LAUNCH_EXIT_NOTICE";

struct alignas(64) ExitNoticeSlot {
  // Bumped by the worker once it holds `mutex` (a futex word: the agent is woken to look).
  uint32_t seq;
  int32_t pid;  // the holder's process and thread (tid is set first)
  int32_t tid;
  uint32_t reserved;
  // Robust and process-shared; held for the worker's life. glibc's begins with its futex word,
  // whose low 30 bits are the holder's thread id (the kernel's robust-futex protocol).
  pthread_mutex_t mutex;
};
// The layout launch's Python standby writes too (worker_sdk/python/_launch_standby.py).
static_assert(sizeof(ExitNoticeSlot) == 64, "an exit notice slot is 64 bytes");
static_assert(offsetof(ExitNoticeSlot, mutex) == 16, "an exit notice slot's mutex is at byte 16");

// The slot of `local_rank` in the file at `path`, held by the calling thread for the life of the
// process (it should be the thread that lives longest: the main one). Idempotent: a process holds
// one slot. False, with `why`, when the file cannot be used; the worker runs on without it.
bool HoldExitNotice(const std::string& path, int local_rank, std::string* why);
// Under launch (LAUNCH_EXIT_NOTICE and LOCAL_RANK set): HoldExitNotice. Without them: false,
// `why` empty.
bool HoldExitNoticeFromEnv(std::string* why);
// Whether this process holds a slot.
bool HoldsExitNotice();

}  // namespace launch_sdk
