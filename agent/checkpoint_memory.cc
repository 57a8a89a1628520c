#include "agent/checkpoint_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace launch {

absl::StatusOr<std::unique_ptr<CheckpointMemory>> CheckpointMemory::Create(int local_world_size) {
  std::unique_ptr<CheckpointMemory> m(new CheckpointMemory());
  for (int i = 0; i < 2 * local_world_size; ++i) {
    const std::string name = absl::StrCat("launch-checkpoint-", i / 2, "-", i % 2);
    UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC));
    if (!fd.valid()) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
    m->fds_.push_back(std::move(fd));
  }
  return m;
}

std::string CheckpointMemory::EnvValue(int local_rank) const {
  const pid_t pid = ::getpid();
  return absl::StrCat("/proc/", pid, "/fd/", fds_.at(2 * local_rank).get(), ",/proc/", pid, "/fd/",
                      fds_.at(2 * local_rank + 1).get());
}

}  // namespace launch
