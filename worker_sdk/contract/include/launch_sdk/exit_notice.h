// A worker's notice to its agent that it is exiting, given by the kernel before it tears down the
// worker's memory. A process's exit frees its memory before its parent can reap it: about 10 ms
// for a LibTorch worker here, during which the agent would not yet know of the death. A worker
// that holds a robust, process-shared mutex in a file the agent maps hands it over as it exits
// (the kernel walks the thread's robust-futex list before it drops the memory): the agent's
// waiter is woken with FUTEX_OWNER_DIED, reads the exit status the kernel has set already
// (/proc/<pid>/task/<tid>/stat), and stops the other workers while the kernel still frees the
// dead one's memory.
//
// The file (kExitNoticeEnv=/proc/<agent pid>/fd/<n>) holds one ExitNoticeSlot per local rank.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "launch_sdk/contract.h"

namespace launch_sdk {

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
// The layout the contract declares (launch_sdk/contract.h), which launch's Python standby writes too.
static_assert(sizeof(ExitNoticeSlot) == kExitNoticeSlotBytes, "an exit notice slot's size is the contract's");
static_assert(offsetof(ExitNoticeSlot, seq) == kExitNoticeSeqOffset, "seq where the contract puts it");
static_assert(offsetof(ExitNoticeSlot, pid) == kExitNoticePidOffset, "pid where the contract puts it");
static_assert(offsetof(ExitNoticeSlot, tid) == kExitNoticeTidOffset, "tid where the contract puts it");
static_assert(offsetof(ExitNoticeSlot, mutex) == kExitNoticeMutexOffset, "the mutex where the contract puts it");

// The slot of `local_rank` in the file at `path`, held by the calling thread for the life of the
// process (it should be the thread that lives longest: the main one). Idempotent: a process holds
// one slot. False, with `why`, when the file cannot be used; the worker runs on without it.
bool HoldExitNotice(const std::string& path, int local_rank, std::string* why);
// Under launch (kExitNoticeEnv and LOCAL_RANK set): HoldExitNotice. Without them: false,
// `why` empty.
bool HoldExitNoticeFromEnv(std::string* why);
// Whether this process holds a slot.
bool HoldsExitNotice();

}  // namespace launch_sdk
