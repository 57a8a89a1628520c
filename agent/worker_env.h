// The worker environment contract: torchrun's variables plus launch's own (launch_sdk/contract.h).
// One pure function builds every local worker's environment for one round; it is unit-tested as a table.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/job_spec.h"
#include "launch_sdk/contract.h"

namespace launch {

using Env = std::map<std::string, std::string>;

// The process environment (environ) as a map.
Env CurrentEnv();
// "KEY=VALUE" strings, for execve.
std::vector<std::string> EnvToStrings(const Env& env);

struct ScaledTraining {
  double lr = 0;
  double lr_scale = 1;
  int per_worker_batch = 0;
  int global_batch = 0;
};

// lr = base_lr * f(global_batch / base_batch), f = identity, sqrt or 1. base_batch defaults to
// per_worker_batch when that is given (scale = world size for linear), else to global_batch.
absl::StatusOr<ScaledTraining> ScaleTraining(const TrainScaling& t, int world_size);

// What one rendezvous round decided for this node.
struct RoundInfo {
  long round = 1;
  int group_rank = 0;
  int group_world_size = 1;
  int world_size = 1;
  int rank_offset = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int restart_count = 0;
  // The group-rank-0 agent serves the store at master_addr:master_port; else worker rank 0 does.
  bool agent_store = false;
};

struct WorkerEnvPlan {
  std::vector<Env> envs;           // one per local rank
  std::vector<std::string> notes;  // what was chosen and why, for one log line each
};

// The fd number at which workers find the agent's progress socket (the contract's).
using launch_sdk::kProgressFd;

// Per local rank: where its files go.
struct WorkerPaths {
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  std::string log_dir;     // kLogDirEnv (profiler traces); empty: not set
  std::string stack_file;  // kStackFileEnv (a hung Python worker's stacks); empty: not set
};

// The threads each worker's OMP/MKL/OpenBLAS pools get: --threads-per-worker, else the usable
// CPUs divided among the local workers (at least 1); a user's OMP_NUM_THREADS overrides both.
struct ThreadPlan {
  int threads = 1;         // what launch would choose
  std::string value;       // what the workers get: `threads`, or the user's OMP_NUM_THREADS
  bool from_user = false;  // value is the user's OMP_NUM_THREADS
};
ThreadPlan PlanThreads(const Env& parent, std::optional<int> threads_per_worker, int usable_cpus, int workers);

// paths[i] is local rank i's.
absl::StatusOr<WorkerEnvPlan> BuildWorkerEnvs(const Env& parent, const WorkerGroupSpec& spec, const RoundInfo& round,
                                              const std::vector<WorkerPaths>& paths);

// The variables launch sets (for --dry-run output): the keys whose value differs from `parent`.
Env EnvDiff(const Env& parent, const Env& env);

}  // namespace launch
