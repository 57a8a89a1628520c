// The worker's start: read the launcher's environment, set LibTorch's threads, pick the device,
// seed per rank, and build the c10d process group (Gloo on CPU, NCCL on CUDA builds).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include <c10/core/Device.h>
#include "launch_sdk/comm.h"
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "launch_sdk/env.h"

namespace launch_sdk {

struct InitOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};  // store and collectives
  uint64_t seed = 0;                                            // every rank seeds seed + rank
  bool cudnn_benchmark = false;                                 // throughput (autotuned kernels) ...
  bool deterministic = false;                                   // ... or reproducibility
  bool force_cpu = false;
  // When every rank is on this host (LOCAL_WORLD_SIZE == WORLD_SIZE) and on CPU, gradients are
  // all-reduced through shared memory instead of Gloo's TCP; LAUNCH_SHM_ALLREDUCE=0 also turns
  // it off. Falls back to Gloo, with a warning, when a rank cannot map the segment.
  bool shm_allreduce = true;
  // Large CPU tensors get their pages in one call, and freed ones are reused (launch_sdk/memory.h);
  // LAUNCH_PREFAULT=0 also turns it off.
  bool prefault = true;
  // Run in a standby (launch --warm-start) before it waits for its go, once the allocator above
  // is installed and the threads are set; never in a worker started cold. A standby becomes its
  // worker, so what this frees stays in the allocator's cache for the worker: a rehearsal of the
  // work a resume and a step do (one step on a dummy batch on a copy of the model, the
  // optimizer's state, DistributedDataParallel::ReserveBuckets) leaves the worker's restore, DDP
  // buckets and first step nothing to fault in. Like everything before Context::Init in a
  // program that declares LAUNCH_SDK_WARM_START(), it must not read the round's variables nor
  // act on the world; it must leave the global state a cold worker would see (seeds are set
  // after it).
  std::function<void()> standby_warm_up;
};

class ShmAllreduce;

class Context {
 public:
  static std::unique_ptr<Context> Init(const InitOptions& opts = {});
  ~Context();

  const WorkerEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  c10::Device device() const { return device_; }
  const c10::intrusive_ptr<Comm>& process_group() const { return pg_; }
  const char* backend() const { return backend_; }
  // The intra-node shared-memory all-reduce, or null when Gloo (or NCCL) does it.
  const std::shared_ptr<ShmAllreduce>& shm_allreduce() const { return shm_; }

  void Barrier();
  // Destroys the process group (also done by the destructor).
  void Destroy();

 private:
  Context() = default;
  WorkerEnv env_;
  c10::Device device_{c10::kCPU};
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Comm> pg_;
  std::shared_ptr<ShmAllreduce> shm_;
  const char* backend_ = "gloo";
};

}  // namespace launch_sdk
