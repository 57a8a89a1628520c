#include "launch_sdk/context.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LAUNCH_SDK_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "env_vars.h"
#include "gloo_waker.h"
#include "library_pages.h"
#include "premap.h"
#include "launch_sdk/checkpoint.h"
#include "launch_sdk/contract.h"
#include "launch_sdk/errors.h"
#include "launch_sdk/exit_notice.h"
#include "launch_sdk/memory.h"
#include "launch_sdk/shm_allreduce.h"
#include "launch_sdk/warm_start.h"
#include "torch_compat.h"

namespace launch_sdk {
namespace {

// The file launch keeps for the node's all-reduce segment (agent/worker_memory.h).

bool IsLoopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// TCPStoreOptions::useLibUV exists from LibTorch 2.2 on (default true from 2.4).
template <typename T, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename T>
struct HasUseLibUV<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

// Rank 0 hosts the store unless the agent does. USE_LIBUV=0 (torch's own variable) asks for the
// classic server; where LibTorch was built without libuv (Debian's 2.x) and USE_LIBUV is unset,
// the classic server is used after one line that says so.
// A template so that the useLibUV lines are compiled only where the member exists.
template <typename Options>
c10::intrusive_ptr<c10d::TCPStore> MakeTcpStore(const WorkerEnv& env, Options so) {
  if constexpr (HasUseLibUV<Options>::value) {
    const char* v = std::getenv("USE_LIBUV");
    if (v && !*v) v = nullptr;  // set but empty: as unset
    if (v && std::string(v) == "0") so.useLibUV = false;
    try {
      return c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    } catch (const std::exception& e) {
      if (!so.useLibUV || v || std::string(e.what()).find("libuv") == std::string::npos) throw;
      std::fprintf(
          stderr,
          "[rank %d] launch_sdk: this LibTorch has no libuv TCPStore; using the classic one (USE_LIBUV=0 skips this try)\n",
          env.rank);
      so.useLibUV = false;
    }
  }
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
}

// Every rank of a one-host group maps one segment that rank 0 sets up and names in the store: the
// file launch keeps for it (LAUNCH_SHM_ALLREDUCE_MEMORY), else a new POSIX shm segment. All ranks
// use it only when all of them could map it, so the choice is the same everywhere.
std::shared_ptr<ShmAllreduce> MakeShmAllreduce(c10d::Store& store, Comm& pg, const WorkerEnv& env,
                                               std::chrono::milliseconds timeout) {
  std::shared_ptr<ShmAllreduce> shm;
  std::string name, error;
  const char* launch_file = internal::EnvValue(kShmAllreduceMemoryEnv);
  // The file serves one group at a time: while an earlier Context of this process still uses it,
  // a reset would pull it from under that group's collectives.
  static std::weak_ptr<ShmAllreduce> in_file;
  const bool file_busy = launch_file && !in_file.expired();
  const char* file = file_busy ? nullptr : launch_file;
  if (env.rank == 0) {
    if (file) {
      try {
        shm = ShmAllreduce::InFile(file, /*reset=*/true, env.rank, env.world_size, timeout);
        name = file;
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (!shm) {
      std::random_device rd;
      name = "/launch_sdk." + std::to_string(getpid()) + "." + std::to_string(rd());
      try {
        shm = std::make_shared<ShmAllreduce>(name, /*create=*/true, env.rank, env.world_size, timeout);
        error.clear();
      } catch (const std::exception& e) {
        error = e.what();
        name.clear();
      }
    }
    store.set("shm_allreduce/name", std::vector<uint8_t>(name.begin(), name.end()));
  } else {
    name = Text(store.get("shm_allreduce/name"));
    if (name.empty()) error = "rank 0 could not create the segment";
    else {
      try {
        if (launch_file && name == launch_file) {
          if (file_busy) throw std::runtime_error(name + " is still used by an earlier Context of this process");
          shm = ShmAllreduce::InFile(name, /*reset=*/false, env.rank, env.world_size, timeout);
        } else {
          shm = std::make_shared<ShmAllreduce>(name, /*create=*/false, env.rank, env.world_size, timeout);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
  }
  store.add("shm_allreduce/mapped", shm ? 1 : 0);
  pg.barrier()->wait();  // everyone has tried to map it
  const int64_t mapped = store.add("shm_allreduce/mapped", 0);
  if (shm && env.rank == 0) shm->Unlink();  // nothing is left in /dev/shm, whatever happens next
  if (shm && shm->in_file()) in_file = shm;
  if (mapped != env.world_size) {
    if (!error.empty())
      std::fprintf(stderr, "[rank %d] launch_sdk: %s; all-reduce goes through gloo\n", env.rank, error.c_str());
    return nullptr;
  }
  return shm;
}

// A standby's mapping of launch's all-reduce file that the group did not take (CUDA, several
// hosts, Gloo after all) goes: it would stay mapped, and cost its exit, for nothing.
void DropUnusedAllreducePremap() {
  if (const char* file = internal::EnvValue(kShmAllreduceMemoryEnv)) internal::DropPremapped(file);
}

}  // namespace

std::unique_ptr<Context> Context::Init(const InitOptions& opts) {
  if (IsStandby()) {
    internal::DropLibraryPages();  // what loading touched; the warm-up brings back what a step uses
    if (opts.standby_warm_up) {
      // Neither variable is the round's: the standby has the values its worker will have.
      const char* prefault = std::getenv(kPrefaultEnv);
      if (opts.prefault && !(prefault && std::strcmp(prefault, "0") == 0)) InstallPrefaultingCpuAllocator();
      // A malformed value is left for ReadWorkerEnv to name, after the go.
      if (const char* threads = internal::EnvValue("OMP_NUM_THREADS")) {
        try {
          at::set_num_threads(static_cast<int>(internal::ParseEnvLong("OMP_NUM_THREADS", threads, 1, INT_MAX)));
        } catch (const std::invalid_argument&) {
        }
      }
      opts.standby_warm_up();
    }
    PremapCheckpointMemory();
    // Empty until the first group's rank 0 sizes it; Init drops the mapping when the group does not use it.
    const char* off = internal::EnvValue(kShmAllreduceEnv);
    if (const char* file = internal::EnvValue(kShmAllreduceMemoryEnv); file && !(off && std::strcmp(off, "0") == 0))
      internal::Premap(file, 0);
    AddStandbyKeepWarm([] {
      TouchPrefaultingCpuAllocatorCache();
      TouchPremappedCheckpointMemory();
    });
  }
  std::unique_ptr<Context> c(new Context());
  c->env_ = ReadWorkerEnv();
  InstallErrorHandlers();
  // The agent sees this worker's failing exit before its memory is freed (launch_sdk/exit_notice.h).
  if (std::string why; !HoldExitNoticeFromEnv(&why) && !why.empty())
    std::fprintf(stderr, "launch_sdk: launch will see this worker's exit only once it is reaped: %s\n", why.c_str());
  const WorkerEnv& env = c->env_;
  if (opts.prefault && env.prefault) InstallPrefaultingCpuAllocator();
  if (env.omp_threads && *env.omp_threads > 0) at::set_num_threads(*env.omp_threads);

  const bool cuda = !opts.force_cpu && torch::cuda::is_available();
  if (cuda) {
    const int index = CudaDeviceIndex(env, static_cast<int>(torch::cuda::device_count()));
    c->device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
#ifdef LAUNCH_SDK_WITH_CUDA
    // NCCL and every kernel launched without an explicit device use the current one.
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#endif
  }
  at::globalContext().setBenchmarkCuDNN(opts.cudnn_benchmark);
  at::globalContext().setDeterministicCuDNN(opts.deterministic);
  torch::manual_seed(opts.seed + static_cast<uint64_t>(env.rank));

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = env.rank == 0 && !env.use_agent_store;
  so.numWorkers = static_cast<size_t>(env.world_size);
  so.timeout = opts.timeout;
  auto tcp = MakeTcpStore(env, so);
  // A restarted group never reads the keys of an earlier attempt.
  c->store_ = c10::make_intrusive<c10d::PrefixStore>("attempt_" + std::to_string(env.restart_count) + "/", tcp);

#ifdef LAUNCH_SDK_WITH_CUDA
  if (cuda) {
    auto nopts = c10d::ProcessGroupNCCL::Options::create();
    nopts->timeout = opts.timeout;
    c->pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(c->store_, env.rank, env.world_size, nopts);
    c->backend_ = "nccl";
    DropUnusedAllreducePremap();
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
  {
    internal::GlooLoopWaker waker(gopts->devices);  // 10 ms less to connect (gloo_waker.h)
    c->pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c->store_, env.rank, env.world_size, gopts);
  }
  c->backend_ = "gloo";
  if (opts.shm_allreduce && env.shm_allreduce && env.world_size > 1 && env.local_world_size == env.world_size)
    c->shm_ = MakeShmAllreduce(*c->store_, *c->pg_, env, opts.timeout);
  DropUnusedAllreducePremap();
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
