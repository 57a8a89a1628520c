#include "launch_sdk/env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <stdexcept>

#include "env_vars.h"
#include "launch_sdk/contract.h"
#include "launch_sdk/warm_start.h"

namespace launch_sdk {
namespace internal {

const char* EnvValue(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

long ParseEnvLong(const char* name, const char* v, long min, long max) {
  char* end = nullptr;
  errno = 0;
  long out = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || out < min || out > max) {
    throw std::invalid_argument(std::string(name) + "=" + v + ": expected an integer in " + std::to_string(min) + ".." +
                                std::to_string(max));
  }
  return out;
}

}  // namespace internal

namespace {

using internal::EnvValue;
using internal::ParseEnvLong;

double ParseDouble(const char* name, const char* v) {
  char* end = nullptr;
  double out = std::strtod(v, &end);
  if (end == v || *end != '\0') {
    throw std::invalid_argument(std::string(name) + "=" + v + ": expected a number");
  }
  return out;
}

void Int(const char* name, int* out, long min = INT_MIN, long max = INT_MAX) {
  if (const char* v = EnvValue(name)) *out = static_cast<int>(ParseEnvLong(name, v, min, max));
}
void OptInt(const char* name, std::optional<int>* out, long min = INT_MIN, long max = INT_MAX) {
  if (const char* v = EnvValue(name)) *out = static_cast<int>(ParseEnvLong(name, v, min, max));
}
void OptDouble(const char* name, std::optional<double>* out) {
  if (const char* v = EnvValue(name)) *out = ParseDouble(name, v);
}
void Bool(const char* name, bool* out) {
  if (const char* v = EnvValue(name)) {
    const std::string s = v;
    if (s == "1") *out = true;
    else if (s == "0") *out = false;
    else throw std::invalid_argument(std::string(name) + "=" + s + ": expected 0 or 1");
  }
}
void Str(const char* name, std::string* out) {
  if (const char* v = EnvValue(name)) *out = v;
}

}  // namespace

WorkerEnv ReadWorkerEnv() {
  AwaitWorkerStart();  // a standby's environment is its worker's only after the go
  WorkerEnv e;
  e.under_launcher = EnvValue("RANK") && EnvValue("WORLD_SIZE");
  // Every number is bounded here: MASTER_PORT sizes a 16-bit port, counts size allocations.
  Int("RANK", &e.rank, 0);
  Int("LOCAL_RANK", &e.local_rank, 0);
  Int("WORLD_SIZE", &e.world_size, 1);
  Int("LOCAL_WORLD_SIZE", &e.local_world_size, 1);
  Int("GROUP_RANK", &e.group_rank, 0);
  Int("TORCHELASTIC_RESTART_COUNT", &e.restart_count, 0);
  Int("TORCHELASTIC_MAX_RESTARTS", &e.max_restarts, 0);
  Str("MASTER_ADDR", &e.master_addr);
  Int("MASTER_PORT", &e.master_port, 1, 65535);
  Str("TORCHELASTIC_RUN_ID", &e.run_id);
  Str("TORCHELASTIC_ERROR_FILE", &e.error_file);
  // torch's own test (rendezvous.py): exactly "True".
  if (const char* v = EnvValue("TORCHELASTIC_USE_AGENT_STORE")) e.use_agent_store = std::string(v) == "True";
  Str(kGpuBindingEnv, &e.gpu_binding);
  OptInt("OMP_NUM_THREADS", &e.omp_threads, 1);
  OptDouble(kLrEnv, &e.lr);
  OptDouble(kLrScaleEnv, &e.lr_scale);
  OptInt(kPerWorkerBatchEnv, &e.per_worker_batch, 1);
  OptInt(kGlobalBatchEnv, &e.global_batch, 1);
  Str(kLogDirEnv, &e.log_dir);
  Str(kProfileStepsEnv, &e.profile_steps);
  Int(kProgressFdEnv, &e.progress_fd, 0);
  Bool(kShmAllreduceEnv, &e.shm_allreduce);
  Bool(kPrefaultEnv, &e.prefault);
  int keep_warm_ms = 0;  // a standby's (warm_start.h); a cold worker rejects what a standby would
  Int(kStandbyKeepWarmMsEnv, &keep_warm_ms, 0, internal::kMaxStandbyKeepWarmMs);
  if (e.world_size < 1) throw std::invalid_argument("WORLD_SIZE must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size) {
    throw std::invalid_argument("RANK=" + std::to_string(e.rank) + ": expected 0.." + std::to_string(e.world_size - 1));
  }
  if (e.gpu_binding != "shared" && e.gpu_binding != "isolate")
    throw std::invalid_argument(std::string(kGpuBindingEnv) + "=" + e.gpu_binding + ": expected shared or isolate");
  return e;
}

int CudaDeviceIndex(const WorkerEnv& env, int visible) {
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string seen = std::to_string(visible) + " CUDA device(s) visible (CUDA_VISIBLE_DEVICES=" +
                           (cvd ? std::string(cvd) : std::string("unset")) + ")";
  if (visible < 1) throw std::invalid_argument("no CUDA device visible: " + seen);
  if (env.gpu_binding == "isolate") return 0;
  if (env.local_rank < 0 || env.local_rank >= visible)
    throw std::invalid_argument("LOCAL_RANK=" + std::to_string(env.local_rank) + " with " + seen +
                                ": expected at most " + std::to_string(visible) +
                                " worker(s) per node (--nproc-per-node=gpu)");
  return env.local_rank;
}

}  // namespace launch_sdk
