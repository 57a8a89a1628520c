#include "agent/worker_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace launch {

absl::StatusOr<UniqueFd> MemoryFile(const std::string& name, unsigned flags) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | flags));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  return fd;
}

std::string WorkerPath(const UniqueFd& fd) { return absl::StrCat("/proc/", ::getpid(), "/fd/", fd.get()); }

absl::StatusOr<std::unique_ptr<WorkerMemory>> WorkerMemory::Create(int local_world_size) {
  std::unique_ptr<WorkerMemory> m(new WorkerMemory());
  for (int i = 0; i < 2 * local_world_size; ++i) {
    auto fd = MemoryFile(absl::StrCat("launch-checkpoint-", i / 2, "-", i % 2));
    if (!fd.ok()) return fd.status();
    m->checkpoint_fds_.push_back(std::move(*fd));
  }
  auto fd = MemoryFile("launch-allreduce");
  if (!fd.ok()) return fd.status();
  m->allreduce_fd_ = std::move(*fd);
  return m;
}

std::string WorkerMemory::CheckpointEnvValue(int local_rank) const {
  return absl::StrCat(WorkerPath(checkpoint_fds_.at(2 * local_rank)), ",",
                      WorkerPath(checkpoint_fds_.at(2 * local_rank + 1)));
}

std::string WorkerMemory::ShmAllreduceEnvValue() const { return WorkerPath(allreduce_fd_); }

}  // namespace launch
