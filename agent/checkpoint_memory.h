// Memory the agent owns for its workers' checkpoints (worker_sdk's Checkpointer): per local rank
// two memory files that outlive the workers, so that a restarted worker resumes from the snapshot
// its predecessor left there. A worker opens them as /proc/<agent pid>/fd/<n> (LAUNCH_CHECKPOINT_MEMORY):
// only processes of launch's user can, and they go with launch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace launch {

inline constexpr char kCheckpointMemoryEnv[] = "LAUNCH_CHECKPOINT_MEMORY";

class CheckpointMemory {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointMemory>> Create(int local_world_size);
  // LAUNCH_CHECKPOINT_MEMORY of a local rank: "PATH,PATH".
  std::string EnvValue(int local_rank) const;

 private:
  CheckpointMemory() = default;
  std::vector<UniqueFd> fds_;  // two per local rank
};

}  // namespace launch
