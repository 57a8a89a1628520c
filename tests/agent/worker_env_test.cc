#include "agent/worker_env.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

std::vector<WorkerPaths> ErrorFiles(int n) {
  std::vector<WorkerPaths> v;
  for (int i = 0; i < n; ++i) v.push_back({"/logs/" + std::to_string(i) + "/error.json", ""});
  return v;
}

struct EnvCase {
  int nproc;
  int rank_offset;
  int world;
  int usable_cpus;
  int expected_threads;
};

void PrintTo(const EnvCase& c, std::ostream* os) { *os << "nproc=" << c.nproc << " offset=" << c.rank_offset; }

class WorkerEnvTable : public ::testing::TestWithParam<EnvCase> {};

TEST_P(WorkerEnvTable, TorchrunContract) {
  const EnvCase& c = GetParam();
  WorkerGroupSpec spec;
  spec.local_world_size = c.nproc;
  spec.run_id = "job";
  spec.max_restarts = 3;
  spec.usable_cpus = c.usable_cpus;
  RoundInfo round;
  round.group_rank = c.rank_offset ? 1 : 0;
  round.group_world_size = c.rank_offset ? 2 : 1;
  round.world_size = c.world;
  round.rank_offset = c.rank_offset;
  round.master_addr = "10.0.0.1";
  round.master_port = 29500;
  round.restart_count = 2;
  Env parent = {{"PATH", "/usr/bin"}, {"HOME", "/root"}};
  auto plan = BuildWorkerEnvs(parent, spec, round, ErrorFiles(c.nproc));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->envs.size(), static_cast<size_t>(c.nproc));
  for (int i = 0; i < c.nproc; ++i) {
    const Env& e = plan->envs[i];
    EXPECT_EQ(e.at("RANK"), std::to_string(c.rank_offset + i));
    EXPECT_EQ(e.at("LOCAL_RANK"), std::to_string(i));
    EXPECT_EQ(e.at("GROUP_RANK"), std::to_string(round.group_rank));
    EXPECT_EQ(e.at("ROLE_RANK"), std::to_string(c.rank_offset + i));
    EXPECT_EQ(e.at("ROLE_NAME"), "default");
    EXPECT_EQ(e.at("LOCAL_WORLD_SIZE"), std::to_string(c.nproc));
    EXPECT_EQ(e.at("WORLD_SIZE"), std::to_string(c.world));
    EXPECT_EQ(e.at("GROUP_WORLD_SIZE"), std::to_string(round.group_world_size));
    EXPECT_EQ(e.at("ROLE_WORLD_SIZE"), std::to_string(c.world));
    EXPECT_EQ(e.at("MASTER_ADDR"), "10.0.0.1");
    EXPECT_EQ(e.at("MASTER_PORT"), "29500");
    EXPECT_EQ(e.at("TORCHELASTIC_RESTART_COUNT"), "2");
    EXPECT_EQ(e.at("TORCHELASTIC_MAX_RESTARTS"), "3");
    EXPECT_EQ(e.at("TORCHELASTIC_RUN_ID"), "job");
    EXPECT_EQ(e.at("TORCHELASTIC_ERROR_FILE"), ErrorFiles(c.nproc)[i].error_file);
    EXPECT_EQ(e.at("LAUNCH_PROGRESS_FD"), "3");
    EXPECT_EQ(e.count("LAUNCH_LOG_DIR"), 0u);
    EXPECT_EQ(e.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    EXPECT_EQ(e.at("OMP_NUM_THREADS"), std::to_string(c.expected_threads));
    EXPECT_EQ(e.count("MKL_NUM_THREADS"), 0u);  // MKL and OpenBLAS follow OMP_NUM_THREADS
    EXPECT_EQ(e.count("OPENBLAS_NUM_THREADS"), 0u);
    EXPECT_EQ(e.at("PATH"), "/usr/bin");  // the parent's environment passes through
    EXPECT_EQ(e.count("CUDA_VISIBLE_DEVICES"), 0u);
    EXPECT_EQ(e.count("PYTORCH_CUDA_ALLOC_CONF"), 0u);  // no GPUs: left alone
  }
}

INSTANTIATE_TEST_SUITE_P(Nproc, WorkerEnvTable,
                         ::testing::Values(EnvCase{1, 0, 1, 8, 8}, EnvCase{2, 0, 2, 8, 4}, EnvCase{4, 0, 4, 8, 2},
                                           EnvCase{4, 4, 8, 2, 1}, EnvCase{2, 2, 4, 3, 1}));

// The plan for `local` workers on `cpus` usable CPUs under the parent environment `parent`.
absl::StatusOr<WorkerEnvPlan> PlanFor(const Env& parent, int local, int cpus) {
  WorkerGroupSpec spec;
  spec.local_world_size = local;
  spec.usable_cpus = cpus;
  return BuildWorkerEnvs(parent, spec, RoundInfo{}, ErrorFiles(local));
}

TEST(WorkerEnv, UserThreadSettingsAndNcclHandlingAreKept) {
  auto plan = PlanFor({{"OMP_NUM_THREADS", "3"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}}, 2, 16);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[0].at("OMP_NUM_THREADS"), "3");
  EXPECT_EQ(plan->envs[0].at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
  EXPECT_THAT(plan->notes[0], ::testing::HasSubstr("kept the user's OMP_NUM_THREADS=3"));
}

// Only OMP_NUM_THREADS is set, as torchrun does: MKL and OpenBLAS follow it unless their own are
// set (launch's MKL_NUM_THREADS used to override a script's OMP_NUM_THREADS), and theirs are kept.
TEST(WorkerEnv, OnlyOmpThreadsIsSetAndTheUsersOthersAreKept) {
  auto plan = PlanFor({{"OPENBLAS_NUM_THREADS", "5"}}, 2, 16);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[1].at("OMP_NUM_THREADS"), "8");
  EXPECT_EQ(plan->envs[1].count("MKL_NUM_THREADS"), 0u);
  EXPECT_EQ(plan->envs[1].at("OPENBLAS_NUM_THREADS"), "5");
  EXPECT_EQ(plan->notes[0],
            "threads: OMP_NUM_THREADS = 8 (16 usable CPUs / 2 local workers); kept the user's "
            "OPENBLAS_NUM_THREADS=5");
  auto user = PlanFor({{"OMP_NUM_THREADS", "3"}}, 2, 16);
  ASSERT_TRUE(user.ok());
  EXPECT_EQ(user->envs[0].at("OMP_NUM_THREADS"), "3");
  EXPECT_EQ(user->envs[0].count("MKL_NUM_THREADS"), 0u);
  EXPECT_EQ(user->notes[0], "threads: kept the user's OMP_NUM_THREADS=3");
}

// torch 1.x reads NCCL_ASYNC_ERROR_HANDLING, 2.x TORCH_NCCL_ASYNC_ERROR_HANDLING: both are set, and
// a user's value of one is given to the other.
TEST(WorkerEnv, NcclAsyncErrorHandlingUnderBothNames) {
  struct Row {
    Env parent;
    const char* torch_name;
    const char* old_name;
  } rows[] = {{{}, "1", "1"},
              {{{"NCCL_ASYNC_ERROR_HANDLING", "3"}}, "3", "3"},
              {{{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}}, "0", "0"},
              {{{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"}, {"NCCL_ASYNC_ERROR_HANDLING", "0"}}, "2", "0"}};
  for (const auto& r : rows) {
    auto plan = PlanFor(r.parent, 1, 2);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->envs[0].at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), r.torch_name);
    EXPECT_EQ(plan->envs[0].at("NCCL_ASYNC_ERROR_HANDLING"), r.old_name);
  }
}

TEST(WorkerEnv, ThreadsPerWorkerFlagWins) {
  WorkerGroupSpec spec;
  spec.local_world_size = 2;
  spec.usable_cpus = 16;
  spec.threads_per_worker = 5;
  auto plan = BuildWorkerEnvs({}, spec, RoundInfo{}, ErrorFiles(2));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[1].at("OMP_NUM_THREADS"), "5");
}

TEST(WorkerEnv, SharedBindingSeesThePoolAndGetsAllocConf) {
  WorkerGroupSpec spec;
  spec.local_world_size = 2;
  spec.gpu_pool = {"0", "1", "2", "3"};
  spec.gpu_pool_is_nvml_indices = true;
  auto plan = BuildWorkerEnvs({}, spec, RoundInfo{}, ErrorFiles(2));
  ASSERT_TRUE(plan.ok());
  for (const auto& e : plan->envs) {
    EXPECT_EQ(e.at("CUDA_VISIBLE_DEVICES"), "0,1,2,3");
    EXPECT_EQ(e.at("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    EXPECT_EQ(e.at("PYTORCH_CUDA_ALLOC_CONF"), "max_split_size_mb:128");
    EXPECT_EQ(e.at("LAUNCH_GPU_BINDING"), "shared");
  }
}

// GPU workers get PyTorch's NCCL flight recorder under both of its names, its dump in the
// rank's log directory; a user's setting of either name wins for both; CPU workers get none.
TEST(WorkerEnv, GpuWorkersGetTheFlightRecorder) {
  WorkerGroupSpec spec;
  spec.local_world_size = 1;
  spec.gpu_pool = {"0"};
  std::vector<WorkerPaths> paths = ErrorFiles(1);
  paths[0].log_dir = "/logs/run/attempt_0/0";
  auto plan = BuildWorkerEnvs({{"TORCH_FR_BUFFER_SIZE", "500"}}, spec, RoundInfo{}, paths);
  ASSERT_TRUE(plan.ok());
  const Env& e = plan->envs[0];
  EXPECT_EQ(e.at("TORCH_NCCL_TRACE_BUFFER_SIZE"), "500");
  EXPECT_EQ(e.at("TORCH_FR_BUFFER_SIZE"), "500");
  EXPECT_EQ(e.at("TORCH_NCCL_DUMP_ON_TIMEOUT"), "1");
  EXPECT_EQ(e.at("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), "/logs/run/attempt_0/0/nccl_trace_rank_");
  EXPECT_EQ(e.at("TORCH_FR_DUMP_TEMP_FILE"), "/logs/run/attempt_0/0/nccl_trace_rank_");
  spec.flight_recorder = false;
  plan = BuildWorkerEnvs({}, spec, RoundInfo{}, paths);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[0].count("TORCH_NCCL_TRACE_BUFFER_SIZE"), 0u);
  spec.flight_recorder = true;
  spec.gpu_pool.clear();
  plan = BuildWorkerEnvs({}, spec, RoundInfo{}, paths);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[0].count("TORCH_FR_BUFFER_SIZE"), 0u);
}

TEST(WorkerEnv, IsolateBindingSplitsThePool) {
  WorkerGroupSpec spec;
  spec.local_world_size = 2;
  spec.gpu_pool = {"GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e"};
  spec.gpu_binding = GpuBinding::kIsolate;
  spec.cuda_alloc_conf = "expandable_segments:True";
  auto plan = BuildWorkerEnvs({}, spec, RoundInfo{}, ErrorFiles(2));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[0].at("CUDA_VISIBLE_DEVICES"), "GPU-a,GPU-b");
  EXPECT_EQ(plan->envs[1].at("CUDA_VISIBLE_DEVICES"), "GPU-c,GPU-d");
  EXPECT_EQ(plan->envs[0].count("CUDA_DEVICE_ORDER"), 0u);  // UUIDs need no ordering
  EXPECT_EQ(plan->envs[0].at("PYTORCH_CUDA_ALLOC_CONF"), "expandable_segments:True");
  EXPECT_THAT(plan->notes[0], ::testing::HasSubstr("1 GPU(s) of the pool left unused"));
}

TEST(WorkerEnv, IsolateNeedsAGpuPerWorker) {
  WorkerGroupSpec spec;
  spec.local_world_size = 3;
  spec.gpu_pool = {"0", "1"};
  spec.gpu_binding = GpuBinding::kIsolate;
  EXPECT_FALSE(BuildWorkerEnvs({}, spec, RoundInfo{}, ErrorFiles(3)).ok());
}

TEST(WorkerEnv, UserAllocConfIsLeftAlone) {
  WorkerGroupSpec spec;
  spec.gpu_pool = {"0"};
  spec.cuda_alloc_conf = "max_split_size_mb:64";
  auto plan = BuildWorkerEnvs({{"PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"}}, spec, RoundInfo{},
                              ErrorFiles(1));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[0].at("PYTORCH_CUDA_ALLOC_CONF"), "backend:cudaMallocAsync");
}

struct ScaleCase {
  LrScaling mode;
  std::optional<int> per_worker, global, base;
  int accum, world;
  double lr, scale;
  int pwb, gb;
};

void PrintTo(const ScaleCase& c, std::ostream* os) { *os << "world=" << c.world << " lr=" << c.lr; }

class ScaleTable : public ::testing::TestWithParam<ScaleCase> {};

TEST_P(ScaleTable, LrAndBatch) {
  const ScaleCase& c = GetParam();
  TrainScaling t;
  t.base_lr = 0.1;
  t.mode = c.mode;
  t.per_worker_batch = c.per_worker;
  t.global_batch = c.global;
  t.base_batch = c.base;
  t.grad_accum_steps = c.accum;
  auto s = ScaleTraining(t, c.world);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->lr, c.lr, 1e-12);
  EXPECT_NEAR(s->lr_scale, c.scale, 1e-12);
  EXPECT_EQ(s->per_worker_batch, c.pwb);
  EXPECT_EQ(s->global_batch, c.gb);
}

INSTANTIATE_TEST_SUITE_P(Scaling, ScaleTable,
                         ::testing::Values(ScaleCase{LrScaling::kLinear, 32, {}, {}, 1, 4, 0.4, 4, 32, 128},
                                           ScaleCase{LrScaling::kSqrt, 32, {}, {}, 1, 4, 0.2, 2, 32, 128},
                                           ScaleCase{LrScaling::kNone, 32, {}, {}, 1, 4, 0.1, 1, 32, 128},
                                           ScaleCase{LrScaling::kLinear, 32, {}, {}, 2, 4, 0.8, 8, 32, 256},
                                           ScaleCase{LrScaling::kLinear, {}, 256, {}, 1, 4, 0.1, 1, 64, 256},
                                           ScaleCase{LrScaling::kLinear, {}, 256, 64, 1, 8, 0.4, 4, 32, 256},
                                           ScaleCase{LrScaling::kLinear, 16, {}, {}, 1, 1, 0.1, 1, 16, 16}));

TEST(Scaling, GlobalBatchMustDivide) {
  TrainScaling t;
  t.base_lr = 0.1;
  t.global_batch = 100;
  auto s = ScaleTraining(t, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), ::testing::HasSubstr("train.global_batch=100"));
}

TEST(WorkerEnv, ScalingVariablesFollowTheRoundsWorldSize) {
  WorkerGroupSpec spec;
  spec.local_world_size = 2;
  TrainScaling t;
  t.base_lr = 0.05;
  t.per_worker_batch = 64;
  spec.train = t;
  RoundInfo round;
  round.world_size = 6;
  auto plan = BuildWorkerEnvs({}, spec, round, ErrorFiles(2));
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[0].at("LAUNCH_LR"), "0.3");
  EXPECT_EQ(plan->envs[0].at("LAUNCH_LR_SCALE"), "6");
  EXPECT_EQ(plan->envs[0].at("LAUNCH_PER_WORKER_BATCH"), "64");
  EXPECT_EQ(plan->envs[0].at("LAUNCH_GLOBAL_BATCH"), "384");
}

TEST(WorkerEnv, LogDirIsExportedWhenKept) {
  WorkerGroupSpec spec;
  spec.local_world_size = 2;
  auto plan = BuildWorkerEnvs({}, spec, RoundInfo{}, {{"/l/0/error.json", "/l/0"}, {"/l/1/error.json", "/l/1"}});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->envs[1].at("LAUNCH_LOG_DIR"), "/l/1");
}

TEST(WorkerEnv, EnvDiffListsOnlyChanges) {
  Env parent = {{"A", "1"}, {"B", "2"}};
  Env child = {{"A", "1"}, {"B", "3"}, {"C", "4"}};
  EXPECT_EQ(EnvDiff(parent, child), (Env{{"B", "3"}, {"C", "4"}}));
}

// torchrun's --virtual-local-rank: every worker is local rank 0 of its own GPU.
TEST(WorkerEnv, VirtualLocalRankIsZeroWithEachWorkersOwnGpu) {
  WorkerGroupSpec spec;
  spec.local_world_size = 2;
  spec.gpu_pool = {"0", "1"};
  spec.gpu_binding = GpuBinding::kIsolate;
  spec.virtual_local_rank = true;
  RoundInfo round;
  round.world_size = 2;
  round.master_addr = "127.0.0.1";
  round.master_port = 29500;
  auto plan = BuildWorkerEnvs({}, spec, round, ErrorFiles(2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->envs[0].at("LOCAL_RANK"), "0");
  EXPECT_EQ(plan->envs[1].at("LOCAL_RANK"), "0");
  EXPECT_EQ(plan->envs[1].at("RANK"), "1");
  EXPECT_EQ(plan->envs[0].at("CUDA_VISIBLE_DEVICES"), "0");
  EXPECT_EQ(plan->envs[1].at("CUDA_VISIBLE_DEVICES"), "1");
  EXPECT_EQ(plan->envs[1].at("LOCAL_WORLD_SIZE"), "2");
}

// The rendezvous token is launch's alone.
TEST(WorkerEnv, TheRendezvousTokenStaysWithLaunch) {
  WorkerGroupSpec spec;
  RoundInfo round;
  round.world_size = 1;
  auto plan = BuildWorkerEnvs({{"LAUNCH_RDZV_TOKEN", "secret-token"}, {"HOME", "/root"}}, spec, round, ErrorFiles(1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->envs[0].count("LAUNCH_RDZV_TOKEN"), 0u);
  EXPECT_EQ(plan->envs[0].at("HOME"), "/root");
}

}  // namespace
}  // namespace launch
