// The plain option types a job is described by (output redirection, GPU binding, training scaling,
// the per-node worker group): shared by the launcher's config and the agent, with no behaviour.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launch_sdk/scaling.h"

namespace launch {

// torchrun's --redirects / --tee value: 0 none, 1 stdout, 2 stderr, 3 both; either one value for
// every local rank or a map "0:1,1:2".
struct StdSpec {
  int all = 0;
  std::map<int, int> per_rank;
  int For(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
  bool Stdout(int local_rank) const { return For(local_rank) & 1; }
  bool Stderr(int local_rank) const { return For(local_rank) & 2; }
  // Whether any local rank's stream goes to a file.
  bool Any() const { return all != 0 || !per_rank.empty(); }
};
// Defined with the log relay (agent/log_relay.cc), which is what reads a StdSpec.
absl::StatusOr<StdSpec> ParseStdSpec(const std::string& value, const std::string& flag);

// The SDK's scaling rules (torch-free) are the one definition both sides use.
using LrScaling = launch_sdk::LrScaling;
enum class GpuBinding { kShared, kIsolate };

// The config's `train:` section: inputs to learning-rate and batch scaling.
struct TrainScaling {
  double base_lr = 0;
  std::optional<int> per_worker_batch;
  std::optional<int> global_batch;
  std::optional<int> base_batch;  // the global batch base_lr was tuned for
  int grad_accum_steps = 1;
  LrScaling mode = LrScaling::kLinear;
};

// What stays fixed for the whole run on this node.
struct WorkerGroupSpec {
  int local_world_size = 1;
  std::string role = "default";
  std::string run_id = "none";
  int max_restarts = 0;
  // CUDA_VISIBLE_DEVICES tokens of the GPUs this node's workers may use; empty: no GPUs.
  std::vector<std::string> gpu_pool;
  // True when the pool came from NVML indices (not an inherited CUDA_VISIBLE_DEVICES): then
  // CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA's numbering match NVML's.
  bool gpu_pool_is_nvml_indices = false;
  GpuBinding gpu_binding = GpuBinding::kShared;
  std::optional<std::string> cuda_alloc_conf;  // --cuda-alloc-conf
  std::optional<int> threads_per_worker;       // --threads-per-worker
  int usable_cpus = 1;
  std::optional<TrainScaling> train;
  // Where launch's Python module (launch_progress) is: appended to the workers' PYTHONPATH.
  std::string python_dir;
  // PyTorch's NCCL flight recorder for GPU workers (--no-flight-recorder turns it off).
  bool flight_recorder = true;
  // torchrun's --virtual-local-rank: every worker's LOCAL_RANK is 0 (with isolated GPUs, its own
  // device 0).
  bool virtual_local_rank = false;
};

}  // namespace launch
