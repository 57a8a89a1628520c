// Memory the agent owns for its workers (worker_sdk), in files that outlive the workers:
//  - per local rank two for its Checkpointer's snapshots, so that a restarted worker resumes from
//    the snapshot its predecessor left there (LAUNCH_CHECKPOINT_MEMORY);
//  - one for the node's shared-memory all-reduce (LAUNCH_SHM_ALLREDUCE_MEMORY), which every
//    attempt's rank 0 sizes and resets, so that a restarted group neither makes nor maps a new
//    segment (a standby maps it before its go).
// A worker opens them as /proc/<agent pid>/fd/<n>: only processes of launch's user can, and they
// go with launch. Empty until a worker sizes them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "launch_sdk/contract.h"

namespace launch {

// The variables that name them (launch_sdk/contract.h).
using launch_sdk::kCheckpointMemoryEnv;
using launch_sdk::kShmAllreduceMemoryEnv;

// A memory file of the agent's (memfd_create, close-on-exec and `flags`), and the path its workers
// open it by: /proc/<agent pid>/fd/<n>.
absl::StatusOr<UniqueFd> MemoryFile(const std::string& name, unsigned flags = 0);
std::string WorkerPath(const UniqueFd& fd);

class WorkerMemory {
 public:
  // The files it holds open: two per local rank and one for the node.
  static int FileCount(int local_world_size) { return 2 * local_world_size + 1; }
  static absl::StatusOr<std::unique_ptr<WorkerMemory>> Create(int local_world_size);
  // LAUNCH_CHECKPOINT_MEMORY of a local rank: "PATH,PATH".
  std::string CheckpointEnvValue(int local_rank) const;
  // LAUNCH_SHM_ALLREDUCE_MEMORY, the same for every local rank: "PATH".
  std::string ShmAllreduceEnvValue() const;

 private:
  WorkerMemory() = default;
  std::vector<UniqueFd> checkpoint_fds_;  // two per local rank
  UniqueFd allreduce_fd_;
};

}  // namespace launch
