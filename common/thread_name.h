// Names for launch's own threads, as `top -H`, gdb, py-spy and /proc/<pid>/task/*/comm show them:
// each background thread says which object it belongs to.
#pragma once

#include <pthread.h>

namespace launch {

// Names the calling thread. The kernel keeps 15 characters; longer names are refused, so keep
// them to "launch-" and a word.
inline void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace launch
