// What the launcher (or torchrun) told this worker, read from the environment; no LibTorch here.
#pragma once

#include <optional>
#include <string>

#include "launch_sdk/defaults.h"

namespace launch_sdk {

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  std::string run_id = "none";
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  std::string gpu_binding = "shared";
  std::optional<int> omp_threads;
  // LAUNCH_ LR/batch values, when the launcher's config had a train section.
  std::optional<double> lr;
  std::optional<double> lr_scale;
  std::optional<int> per_worker_batch;
  std::optional<int> global_batch;
  std::string log_dir;          // LAUNCH_LOG_DIR (this attempt's directory for this rank)
  std::string profile_steps;    // LAUNCH_PROFILE_STEPS, "a-b"
  int progress_fd = -1;         // LAUNCH_PROGRESS_FD
  bool shm_allreduce = true;    // LAUNCH_SHM_ALLREDUCE (0 turns it off)
  bool prefault = true;         // LAUNCH_PREFAULT (0 turns it off)
  bool under_launcher = false;  // RANK and WORLD_SIZE were set
  // TORCHELASTIC_USE_AGENT_STORE=True: the agent serves the store at MASTER_ADDR:MASTER_PORT (as
  // torchrun's), so no rank hosts one.
  bool use_agent_store = false;
};

// Reads the variables; missing ones keep the single-process defaults. A malformed value throws
// std::invalid_argument naming the variable and the value.
WorkerEnv ReadWorkerEnv();

// The CUDA device this worker uses among the `visible` ones it sees (CUDA_VISIBLE_DEVICES):
// LAUNCH_GPU_BINDING=isolate: its own, device 0; shared (launch's default, torchrun's way): device
// LOCAL_RANK. Throws std::invalid_argument naming the values when there is no such device, since
// two workers on one GPU fail later and less clearly (NCCL: "Duplicate GPU detected").
int CudaDeviceIndex(const WorkerEnv& env, int visible);

}  // namespace launch_sdk
