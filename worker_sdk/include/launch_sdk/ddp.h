// Data parallelism: parameters and buffers broadcast from rank 0 at the start; gradients averaged
// in buckets (default 25 MiB) launched from autograd hooks as backward produces them, so
// communication overlaps the rest of backward; NoSync for gradient accumulation.
// After the first step each parameter's .grad is a view into its bucket (PyTorch's
// gradient_as_bucket_view), so gradients are accumulated and all-reduced in place, with no copies;
// an optimizer that sets .grad to none costs one copy per step instead.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "launch_sdk/comm.h"
#include "launch_sdk/shm_allreduce.h"
#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

namespace launch_sdk {

struct DdpOptions {
  size_t bucket_bytes = 25u << 20;
  bool broadcast_buffers = true;  // rank 0's buffers before every SyncBuffers()
  // Rank 0's parameters and buffers are broadcast at construction (as torch's DDP init_sync).
  // False skips it where every rank holds the same ones already: all resumed from one checkpoint
  // (Checkpointer::LoadLatest returned the same step everywhere).
  bool init_sync = true;
  // Gradients go through this instead of the process group when set (the constructor that takes
  // a Context sets it to Context::shm_allreduce()).
  std::shared_ptr<ShmAllreduce> local_allreduce;
};

class Context;

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<Comm> pg, DdpOptions opts = {});
  // The context's process group, and its shared-memory all-reduce where it has one.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, const Context& ctx, DdpOptions opts = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  // Allocates and frees the buckets a DistributedDataParallel of `module` with `opts` would make
  // (no process group needed): in a standby's warm-up (InitOptions::standby_warm_up) their memory
  // stays in the prefaulting allocator's cache for the worker's buckets.
  static void ReserveBuckets(const torch::nn::Module& module, const DdpOptions& opts = {});
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // While alive, backward accumulates gradients locally; the next synced backward averages
  // the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel* ddp) : ddp_(ddp) { ddp_->sync_ = false; }
    ~NoSync() { ddp_->sync_ = true; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  NoSync no_sync() { return NoSync(this); }

  // Broadcasts rank 0's buffers (batch-norm statistics); call before a forward when they matter.
  void SyncBuffers();
  size_t num_buckets() const { return buckets_.size(); }
  // Seconds spent waiting for the gradient all-reduces since the last call: the time this rank
  // waited for the others (progress reports it, so that stragglers can be told apart).
  double TakeWaitSeconds();
  bool uses_shared_memory() const { return opts_.local_allreduce != nullptr; }
  torch::nn::Module& module() { return *module_; }

 private:
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    size_t pending = 0;
    bool ready = false;
    c10::intrusive_ptr<c10d::Work> work;
    std::shared_ptr<ShmWork> local_work;
  };
  void OnGradReady(size_t param);                           // after autograd accumulated the parameter's .grad
  at::Tensor& View(size_t param) { return views_[param]; }  // its slice of its bucket
  void LaunchReadyBuckets();
  void Finish();  // end of backward: wait, write the averages into .grad

  std::shared_ptr<torch::nn::Module> module_;
  c10::intrusive_ptr<Comm> pg_;
  DdpOptions opts_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> views_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive for the hooks
  std::vector<uintptr_t> hooks_;
  std::vector<size_t> bucket_of_;
  std::vector<bool> seen_;
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;
  bool sync_ = true;
  bool finish_queued_ = false;
  double wait_seconds_ = 0;  // mu_
  std::mutex mu_;
};

}  // namespace launch_sdk
