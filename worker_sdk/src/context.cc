#include "launch_sdk/context.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LAUNCH_SDK_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>

#include "launch_sdk/errors.h"
#include "launch_sdk/shm_allreduce.h"

namespace launch_sdk {
namespace {

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// Every rank of a one-host group maps one segment that rank 0 creates and names in the store.
// All ranks use it only when all of them could map it, so the choice is the same everywhere.
std::shared_ptr<ShmAllreduce> MakeShmAllreduce(c10d::Store& store, Comm& pg, const WorkerEnv& env,
                                               std::chrono::milliseconds timeout) {
  std::shared_ptr<ShmAllreduce> shm;
  std::string name, error;
  if (env.rank == 0) {
    std::random_device rd;
    name = "/launch_sdk." + std::to_string(getpid()) + "." + std::to_string(rd());
    try {
      shm = std::make_shared<ShmAllreduce>(name, /*create=*/true, env.rank, env.world_size, timeout);
    } catch (const std::exception& e) {
      error = e.what();
      name.clear();
    }
    store.set("shm_allreduce/name", std::vector<uint8_t>(name.begin(), name.end()));
  } else {
    name = Text(store.get("shm_allreduce/name"));
    if (name.empty()) error = "rank 0 could not create the segment";
    else {
      try {
        shm = std::make_shared<ShmAllreduce>(name, /*create=*/false, env.rank, env.world_size, timeout);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  store.add("shm_allreduce/mapped", shm ? 1 : 0);
  pg.barrier()->wait();  // everyone has tried to map it
  const int64_t mapped = store.add("shm_allreduce/mapped", 0);
  if (shm && env.rank == 0) shm->Unlink();  // nothing is left in /dev/shm, whatever happens next
  if (mapped != env.world_size) {
    if (!error.empty()) std::fprintf(stderr, "[rank %d] launch_sdk: %s; all-reduce goes through gloo\n", env.rank, error.c_str());
    return nullptr;
  }
  return shm;
}

}  // namespace

std::unique_ptr<Context> Context::Init(const InitOptions& opts) {
  std::unique_ptr<Context> c(new Context());
  c->env_ = ReadWorkerEnv();
  InstallErrorHandlers();
  const WorkerEnv& env = c->env_;
  if (env.omp_threads && *env.omp_threads > 0) at::set_num_threads(*env.omp_threads);

  const bool cuda = !opts.force_cpu && torch::cuda::is_available();
  if (cuda) {
    // isolate: this worker sees only its own GPU(s); shared: all of them, pick LOCAL_RANK.
    const int count = static_cast<int>(torch::cuda::device_count());
    const int index = env.gpu_binding == "isolate" ? 0 : env.local_rank % count;
    c->device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  at::globalContext().setBenchmarkCuDNN(opts.cudnn_benchmark);
  at::globalContext().setDeterministicCuDNN(opts.deterministic);
  torch::manual_seed(opts.seed + static_cast<uint64_t>(env.rank));

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = env.rank == 0;  // rank 0 hosts the store, as with torchrun
  so.numWorkers = static_cast<size_t>(env.world_size);
  so.timeout = opts.timeout;
  auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  // A restarted group never reads the keys of an earlier attempt.
  c->store_ = c10::make_intrusive<c10d::PrefixStore>(
      "attempt_" + std::to_string(env.restart_count) + "/", tcp);

#ifdef LAUNCH_SDK_WITH_CUDA
  if (cuda) {
    auto nopts = c10d::ProcessGroupNCCL::Options::create();
    nopts->timeout = opts.timeout;
    c->pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(c->store_, env.rank, env.world_size, nopts);
    c->backend_ = "nccl";
    return c;
  }
#endif
  auto gopts = c10d::ProcessGroupGloo::Options::create(opts.timeout);
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (IsLoopback(env.master_addr)) {
    gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    gopts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  c->pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c->store_, env.rank, env.world_size, gopts);
  c->backend_ = "gloo";
  if (opts.shm_allreduce && env.shm_allreduce && env.world_size > 1 && env.local_world_size == env.world_size)
    c->shm_ = MakeShmAllreduce(*c->store_, *c->pg_, env, opts.timeout);
  return c;
}

void Context::Barrier() {
  if (pg_) pg_->barrier()->wait();
}

void Context::Destroy() {
  shm_.reset();
  pg_.reset();
  store_.reset();
}

Context::~Context() { Destroy(); }

}  // namespace launch_sdk
