#include "agent/worker_env.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/launch_env.h"
#include "common/status_macros.h"

extern char** environ;

namespace launch {

Env CurrentEnv() {
  Env env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::vector<std::string> EnvToStrings(const Env& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(absl::StrCat(k, "=", v));
  return out;
}

absl::StatusOr<ScaledTraining> ScaleTraining(const TrainScaling& t, int world_size) {
  if (world_size < 1) return absl::InvalidArgumentError("world size must be at least 1");
  if (t.grad_accum_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("train.grad_accum_steps=", t.grad_accum_steps, ": expected >= 1"));
  }
  ScaledTraining out;
  int per_step = world_size * t.grad_accum_steps;
  if (t.per_worker_batch) {
    out.per_worker_batch = *t.per_worker_batch;
    out.global_batch = *t.per_worker_batch * per_step;
  } else if (t.global_batch) {
    if (*t.global_batch % per_step != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.global_batch=", *t.global_batch, " is not divisible by world size ", world_size,
                       " x grad_accum_steps ", t.grad_accum_steps, "; expected a multiple of ", per_step));
    }
    out.global_batch = *t.global_batch;
    out.per_worker_batch = *t.global_batch / per_step;
  } else {
    return absl::InvalidArgumentError("train.base_lr needs train.per_worker_batch or train.global_batch");
  }
  launch_sdk::ScalingConfig c;
  c.base_lr = t.base_lr;
  c.per_worker_batch = out.per_worker_batch;
  c.grad_accum_steps = t.grad_accum_steps;
  c.mode = t.mode;
  c.base_batch = t.base_batch ? *t.base_batch : t.per_worker_batch ? *t.per_worker_batch : *t.global_batch;
  const launch_sdk::Scaled s = launch_sdk::ScaleForWorld(c, world_size);
  out.lr_scale = s.lr_scale;
  out.lr = s.peak_lr;
  return out;
}

ThreadPlan PlanThreads(const Env& parent, std::optional<int> threads_per_worker, int usable_cpus, int workers) {
  ThreadPlan plan;
  // The CPUs this process may use, divided among the local workers.
  plan.threads = threads_per_worker ? *threads_per_worker : std::max(1, usable_cpus / std::max(1, workers));
  plan.value = std::to_string(plan.threads);
  // A user's OMP_NUM_THREADS is their choice for the other two libraries as well (torch sizes
  // MKL's and OpenBLAS's pools from theirs when set), unless those are set themselves.
  if (auto omp = parent.find("OMP_NUM_THREADS"); omp != parent.end()) {
    int user = 0;
    if (absl::SimpleAtoi(omp->second, &user) && user >= 1) {
      plan.value = std::to_string(user);
      plan.from_user = true;
    }
  }
  return plan;
}

namespace {

std::string FormatDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// Sets key unless the user already exported it; returns whether it was set.
bool SetUnlessUserSet(const Env& parent, Env& env, const std::string& key, const std::string& v);

// PyTorch's NCCL flight recorder: a ring of the last collectives, dumped when the watchdog times
// out, so a hang in NCCL shows which collective each rank was in. Under both of PyTorch's names
// (TORCH_NCCL_*, and the TORCH_FR_* that newer releases read), each pair taking the user's value
// of either one; the dump goes to the rank's log directory when there is one.
void SetFlightRecorder(const Env& parent, const std::string& log_dir, Env& env) {
  auto pair = [&](const char* old_name, const char* new_name, const std::string& value) {
    auto o = parent.find(old_name);
    auto n = parent.find(new_name);
    const std::string v = o != parent.end() ? o->second : n != parent.end() ? n->second : value;
    SetUnlessUserSet(parent, env, old_name, v);
    SetUnlessUserSet(parent, env, new_name, v);
  };
  pair("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "2000");
  SetUnlessUserSet(parent, env, "TORCH_NCCL_DUMP_ON_TIMEOUT", "1");
  if (!log_dir.empty()) {
    pair("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE", log_dir + "/nccl_trace_rank_");
  }
}

bool SetUnlessUserSet(const Env& parent, Env& env, const std::string& key, const std::string& v) {
  if (parent.count(key)) return false;
  env[key] = v;
  return true;
}

// GPUs each worker gets of the pool under --gpu-binding=isolate (0: shared, or no GPUs).
absl::StatusOr<int> PerWorkerGpus(const WorkerGroupSpec& spec, int n, std::vector<std::string>* notes) {
  const int pool = static_cast<int>(spec.gpu_pool.size());
  if (pool == 0 || spec.gpu_binding != GpuBinding::kIsolate) return 0;
  if (pool < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-binding=isolate needs at least one GPU per worker: ", n, " workers, ", pool, " GPUs"));
  }
  const int per_worker = pool / n;
  if (pool % n != 0) {
    notes->push_back(absl::StrCat("gpu-binding isolate: ", per_worker, " GPU(s) per worker; ", pool % n,
                                  " GPU(s) of the pool left unused"));
  }
  return per_worker;
}

// torchrun's variables for local rank `local`, and launch's own that every worker gets.
void SetRankEnv(const Env& parent, const WorkerGroupSpec& spec, const RoundInfo& round, const WorkerPaths& paths,
                int local, Env& env) {
  // The rendezvous token is launch's: a worker (or anything it runs) has no use for it.
  env.erase(kRdzvTokenEnv);
  // A standby's (agent/warm_start.h), were launch itself run by one: never a worker's.
  for (const char* k : {launch_sdk::kStandbyFdEnv, launch_sdk::kStandbyForkEnv, launch_sdk::kStandbyImportsEnv})
    env.erase(k);
  const int rank = round.rank_offset + local;
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(spec.virtual_local_rank ? 0 : local);
  env["GROUP_RANK"] = std::to_string(round.group_rank);
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_NAME"] = spec.role;
  env["LOCAL_WORLD_SIZE"] = std::to_string(spec.local_world_size);
  env["WORLD_SIZE"] = std::to_string(round.world_size);
  env["GROUP_WORLD_SIZE"] = std::to_string(round.group_world_size);
  env["ROLE_WORLD_SIZE"] = std::to_string(round.world_size);
  env["MASTER_ADDR"] = round.master_addr;
  env["MASTER_PORT"] = std::to_string(round.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(round.restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(spec.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = spec.run_id;
  // torch's workers test for exactly "True": then none of them hosts the store, and torch 1.x
  // prefixes their keys with /worker/attempt_<TORCHELASTIC_RESTART_COUNT>.
  env["TORCHELASTIC_USE_AGENT_STORE"] = round.agent_store ? "True" : "False";
  env["TORCHELASTIC_ERROR_FILE"] = paths.error_file;
  if (!paths.log_dir.empty()) env[launch_sdk::kLogDirEnv] = paths.log_dir;
  if (!paths.stack_file.empty()) env[launch_sdk::kStackFileEnv] = paths.stack_file;
  if (!spec.python_dir.empty()) {
    // After the user's entries: launch_progress never shadows a module of theirs.
    auto user = parent.find("PYTHONPATH");
    env["PYTHONPATH"] = user != parent.end() && !user->second.empty() ? absl::StrCat(user->second, ":", spec.python_dir)
                                                                      : spec.python_dir;
  }
  env[launch_sdk::kProgressFdEnv] = std::to_string(kProgressFd);
  // torch 2.x reads TORCH_NCCL_ASYNC_ERROR_HANDLING, 1.x NCCL_ASYNC_ERROR_HANDLING: both, with
  // the user's value of either one when only that one is set.
  for (const auto& [name, other] :
       {std::pair<const char*, const char*>{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"},
        {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}}) {
    auto user = parent.find(other);
    SetUnlessUserSet(parent, env, name, user != parent.end() ? user->second : "1");
  }
  env[launch_sdk::kRoundEnv] = std::to_string(round.round);
}

// The GPUs local rank `local` sees: the whole pool (shared) or its own slice (isolate).
void SetGpuEnv(const Env& parent, const WorkerGroupSpec& spec, const WorkerPaths& paths, int local, int per_worker_gpus,
               Env& env) {
  if (spec.gpu_pool.empty()) return;
  env[launch_sdk::kGpuBindingEnv] = spec.gpu_binding == GpuBinding::kShared ? "shared" : "isolate";
  if (spec.gpu_binding == GpuBinding::kShared) {
    env["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(spec.gpu_pool, ",");
  } else {
    std::vector<std::string> mine(spec.gpu_pool.begin() + local * per_worker_gpus,
                                  spec.gpu_pool.begin() + (local + 1) * per_worker_gpus);
    env["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(mine, ",");
  }
  if (spec.gpu_pool_is_nvml_indices) SetUnlessUserSet(parent, env, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
  if (spec.flight_recorder) SetFlightRecorder(parent, paths.log_dir, env);
}

void SetTrainingEnv(const ScaledTraining& scaled, Env& env) {
  env[launch_sdk::kLrEnv] = FormatDouble(scaled.lr);
  env[launch_sdk::kLrScaleEnv] = FormatDouble(scaled.lr_scale);
  env[launch_sdk::kPerWorkerBatchEnv] = std::to_string(scaled.per_worker_batch);
  env[launch_sdk::kGlobalBatchEnv] = std::to_string(scaled.global_batch);
}

// "threads: OMP_NUM_THREADS, ... = 4 (why); kept the user's ...".
std::string ThreadsNote(const Env& parent, const WorkerGroupSpec& spec, const ThreadPlan& thread_plan,
                        const std::vector<std::string>& set, const std::vector<std::string>& user) {
  const std::string& threads_text = thread_plan.value;
  std::string note = absl::StrCat("threads: ");
  if (!set.empty()) {
    absl::StrAppend(&note, absl::StrJoin(set, ", "), " = ", threads_text,
                    spec.threads_per_worker ? " (--threads-per-worker)"
                                            : absl::StrCat(" (", spec.usable_cpus, " usable CPUs / ",
                                                           spec.local_world_size, " local workers)"));
  }
  if (!user.empty()) {
    std::vector<std::string> kept;
    for (const auto& v : user) kept.push_back(absl::StrCat(v, "=", parent.at(v)));
    absl::StrAppend(&note, set.empty() ? "" : "; ", "kept the user's ", absl::StrJoin(kept, ", "));
  }
  return note;
}

}  // namespace

absl::StatusOr<WorkerEnvPlan> BuildWorkerEnvs(const Env& parent, const WorkerGroupSpec& spec, const RoundInfo& round,
                                              const std::vector<WorkerPaths>& paths) {
  const int n = spec.local_world_size;
  if (n < 1) return absl::InvalidArgumentError("local world size must be at least 1");
  if (static_cast<int>(paths.size()) != n) {
    return absl::InvalidArgumentError("one set of paths per local rank expected");
  }
  WorkerEnvPlan plan;
  // GPUs: shared (every worker sees the pool, picks LOCAL_RANK) or isolate (own slice).
  ASSIGN_OR_RETURN(const int per_worker_gpus, PerWorkerGpus(spec, n, &plan.notes));
  const ThreadPlan thread_plan = PlanThreads(parent, spec.threads_per_worker, spec.usable_cpus, n);
  std::vector<std::string> thread_vars_set, thread_vars_user;
  // PYTORCH_CUDA_ALLOC_CONF: the user's, else --cuda-alloc-conf, else a default when GPUs are used.
  std::optional<std::string> alloc_conf = spec.cuda_alloc_conf;
  if (!alloc_conf && !spec.gpu_pool.empty()) alloc_conf = "max_split_size_mb:128";
  std::optional<ScaledTraining> scaled;
  if (spec.train) {
    ASSIGN_OR_RETURN(scaled, ScaleTraining(*spec.train, round.world_size));
  }

  for (int local = 0; local < n; ++local) {
    Env env = parent;
    SetRankEnv(parent, spec, round, paths[local], local, env);
    // OMP_NUM_THREADS only, as torchrun: MKL and OpenBLAS size their pools from it when their own
    // variables are unset, so a script that sets OMP_NUM_THREADS in os.environ before importing
    // torch or numpy gets its value in all three (an MKL_NUM_THREADS of launch's won over it).
    const bool set = SetUnlessUserSet(parent, env, "OMP_NUM_THREADS", thread_plan.value);
    if (local == 0) {
      (set ? thread_vars_set : thread_vars_user).push_back("OMP_NUM_THREADS");
      for (const char* var : {"MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
        if (parent.count(var)) thread_vars_user.push_back(var);
    }
    SetGpuEnv(parent, spec, paths[local], local, per_worker_gpus, env);
    if (alloc_conf) SetUnlessUserSet(parent, env, "PYTORCH_CUDA_ALLOC_CONF", *alloc_conf);
    if (scaled) SetTrainingEnv(*scaled, env);
    plan.envs.push_back(std::move(env));
  }

  plan.notes.push_back(ThreadsNote(parent, spec, thread_plan, thread_vars_set, thread_vars_user));
  if (scaled) {
    plan.notes.push_back(absl::StrCat("training: world size ", round.world_size, ", lr ", FormatDouble(scaled->lr),
                                      " (x", FormatDouble(scaled->lr_scale), "), per-worker batch ",
                                      scaled->per_worker_batch, ", global batch ", scaled->global_batch));
  }
  return plan;
}

Env EnvDiff(const Env& parent, const Env& env) {
  Env out;
  for (const auto& [k, v] : env) {
    auto it = parent.find(k);
    if (it == parent.end() || it->second != v) out[k] = v;
  }
  return out;
}

}  // namespace launch
