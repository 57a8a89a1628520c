// worker_sdk end to end under the real `launch`: DDP equivalence, kill-and-resume, error files,
// the profiler's trace.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct DdpCase {
  const char* name;
  const char* bucket_bytes;
  const char* accum;
  const char* expect_buckets;
  const char* nproc;
  const char* shm;  // LAUNCH_SHM_ALLREDUCE: 1 all-reduces through shared memory, 0 through Gloo
};

void PrintTo(const DdpCase& c, std::ostream* os) { *os << c.name; }

class DdpEquivalence : public ::testing::TestWithParam<DdpCase> {};

TEST_P(DdpEquivalence, RanksMatchOneProcessOnTheWholeBatch) {
  TempDir dir;
  const DdpCase& c = GetParam();
  auto single = RunCmd({SDK_WORKER_BIN, "single", dir / "single.bin", c.accum});
  ASSERT_EQ(single.exit_code, 0) << single.err;
  auto ddp = RunCmd({LAUNCH_BIN, std::string("--nproc-per-node=") + c.nproc, SDK_WORKER_BIN, "ddp", dir / "ddp.bin",
                     c.bucket_bytes, c.accum},
                    {std::string("LAUNCH_SHM_ALLREDUCE=") + c.shm}, std::chrono::seconds(120));
  ASSERT_EQ(ddp.exit_code, 0) << ddp.err;
  // Under launch the segment is launch's file (LAUNCH_SHM_ALLREDUCE_MEMORY), and each rank holds
  // its exit notice.
  EXPECT_THAT(ddp.out, HasSubstr(std::string("[0]:buckets=") + c.expect_buckets + " shm=" + c.shm + " shm_file=" +
                                 c.shm + " exit_notice=1"));
  double diff = MaxAbsDiff(ReadFloats(dir / "single.bin"), ReadFloats(dir / "ddp.bin"));
  EXPECT_LE(diff, 1e-5) << "max abs diff after 20 SGD steps";
}

// The model has 6 parameter tensors: 2336 floats in all; 2 KiB buckets give 3 buckets.
INSTANTIATE_TEST_SUITE_P(
    Sdk, DdpEquivalence,
    ::testing::Values(DdpCase{"one_bucket", "26214400", "1", "1", "2", "1"},
                      DdpCase{"three_buckets", "4300", "1", "3", "2", "1"},
                      DdpCase{"no_sync_accumulation", "26214400", "2", "1", "2", "1"},
                      DdpCase{"four_ranks_three_buckets", "4300", "1", "3", "4", "1"},
                      DdpCase{"gloo_one_bucket", "26214400", "1", "1", "2", "0"},
                      DdpCase{"gloo_three_buckets", "4300", "1", "3", "2", "0"},
                      DdpCase{"gloo_no_sync_accumulation", "26214400", "2", "1", "2", "0"}),
    [](const auto& info) { return std::string(info.param.name); });

// An open-file limit that leaves launch no room for its worker memory: no LAUNCH_SHM_ALLREDUCE_MEMORY,
// and rank 0 makes a segment of its own, as outside launch.
TEST(Sdk, WithoutLaunchsFileForTheSegmentRankZeroMakesOneOfItsOwn) {
  TempDir dir;
  auto single = RunCmd({SDK_WORKER_BIN, "single", dir / "single.bin", "1"});
  ASSERT_EQ(single.exit_code, 0) << single.err;
  auto ddp = RunCmd({"/bin/sh", "-c", "ulimit -n 70 && exec \"$@\"", "sh", LAUNCH_BIN, "--nproc-per-node=2",
                     SDK_WORKER_BIN, "ddp", dir / "ddp.bin", "26214400", "1"},
                    {}, std::chrono::seconds(120));
  ASSERT_EQ(ddp.exit_code, 0) << ddp.err;
  EXPECT_THAT(ddp.err, HasSubstr("checkpoints cannot be kept in memory, nor the all-reduce segment between attempts: the open-file limit (70) leaves no room for 5 more files"));
  EXPECT_THAT(ddp.err, HasSubstr("workers give no exit notices: the open-file limit (70) leaves no room for 2 more files"));
  EXPECT_THAT(ddp.out, HasSubstr("[0]:buckets=1 shm=1 shm_file=0 exit_notice=0"));
  EXPECT_LE(MaxAbsDiff(ReadFloats(dir / "single.bin"), ReadFloats(dir / "ddp.bin")), 1e-5);
}

// DdpOptions::init_sync: rank 0's weights reach rank 1 at construction, or (false) each keeps its own.
TEST(Sdk, DdpInitSyncBroadcastsRankZerosWeightsUnlessTurnedOff) {
  auto first_weights = [](const char* init_sync) {
    auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", SDK_WORKER_BIN, "init-sync", init_sync}, {},
                    std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> w(2);
    for (int rank = 0; rank < 2; ++rank) {
      const std::string tag = absl::StrCat("[", rank, "]:first weight ");
      const size_t at = r.out.find(tag);
      EXPECT_NE(at, std::string::npos) << r.out;
      if (at != std::string::npos) w[rank] = r.out.substr(at + tag.size(), r.out.find('\n', at) - at - tag.size());
    }
    return w;
  };
  auto synced = first_weights("true");
  EXPECT_EQ(synced[0], synced[1]);
  auto own = first_weights("false");
  EXPECT_NE(own[0], own[1]);
  EXPECT_EQ(own[0], synced[0]);  // rank 0's own either way
}

// Trains 2 ranks straight through, started cold, then again with rank 1 killed at step 22 and the
// group resumed from the step-20 checkpoint, started warm (train_mlp declares
// LAUNCH_SDK_WARM_START(): each attempt's workers were standbys that loaded LibTorch and rehearsed
// a step ahead); both runs must end with the same parameters. Returns the first run.
RunResult ExpectKillAndResumeMatches(const std::vector<std::string>& flags) {
  TempDir dir;
  std::vector<std::string> train = {TRAIN_MLP_BIN, "--dims", "32,64,64,10", "--batch", "16", "--steps", "40",
                                    "--dataset-size", "256", "--warmup", "0", "--checkpoint-every", "5",
                                    "--print-every", "0"};
  train.insert(train.end(), flags.begin(), flags.end());
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = train;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  std::vector<std::string> straight = {LAUNCH_BIN, "--nproc-per-node=2", "--warm-start=false"};
  for (const auto& a : with({"--checkpoint-dir", dir / "a", "--save-params", dir / "a.bin"})) straight.push_back(a);
  auto a = RunCmd(straight, {}, std::chrono::seconds(180));
  EXPECT_EQ(a.exit_code, 0) << a.err;

  std::vector<std::string> crashed = {LAUNCH_BIN, "--nproc-per-node=2", "--max-restarts=1"};
  for (const auto& x : with({"--checkpoint-dir", dir / "b", "--save-params", dir / "b.bin", "--fail-at-step", "22"}))
    crashed.push_back(x);
  auto b = RunCmd(crashed, {}, std::chrono::seconds(180));
  EXPECT_EQ(b.exit_code, 0) << b.err;
  EXPECT_THAT(b.out, HasSubstr("fault injection: rank 1 kills itself at step 22"));
  EXPECT_THAT(b.err, HasSubstr("restarting the group"));
  // From the newest checkpoint committed before the kill: step 20 on a quiet machine, an earlier one
  // where the step-20 save had not finished two steps later (a loaded machine); either way the
  // parameters below must match.
  EXPECT_THAT(b.out, ::testing::ContainsRegex("resumed from step (5|10|15|20) "));
  EXPECT_THAT(a.err, Not(HasSubstr("started warm")));
  for (const char* round : {"round 1", "round 2"})
    EXPECT_THAT(b.err, HasSubstr(absl::StrCat(round, ": 2 of 2 worker(s) started warm (0 forked from standbys that stay)")));
  double diff = MaxAbsDiff(ReadFloats(dir / "a.bin"), ReadFloats(dir / "b.bin"));
  EXPECT_LE(diff, 1e-6);
  return a;
}

TEST(Sdk, KillAndResumeEndsWithTheSameParameters) { ExpectKillAndResumeMatches({}); }

// The bytes train_mlp's init stamps say the prefaulting allocator held at Context::Init, by
// "rank restart".
std::map<std::string, int64_t> CachedAtInit(const std::string& stamp_file) {
  std::map<std::string, int64_t> cached;
  for (absl::string_view line : absl::StrSplit(ReadFile(stamp_file), '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    int64_t bytes = -1;
    if (f.size() == 6 && f[0] == "init" && absl::SimpleAtoi(f[3], &bytes)) cached[f[1] + " " + f[2]] = bytes;
  }
  return cached;
}

// A standby rehearses a step (InitOptions::standby_warm_up): each warm worker, in both attempts,
// starts with the memory of a model copy's weights, gradients, momentum and DDP bucket in the
// allocator's cache (2 MiB each for the 512x1024 weight, the one tensor over its 128 KiB floor);
// a cold worker with none. The parameters are the ones the cold run ends with (the rehearsal
// changed nothing the training sees).
TEST(Sdk, AStandbyRehearsesAStepForItsWorker) {
  TempDir dir;
  std::vector<std::string> train = {TRAIN_MLP_BIN, "--dims", "512,1024,10", "--batch", "16", "--steps", "30",
                                    "--dataset-size", "256", "--warmup", "0", "--checkpoint-every", "5",
                                    "--print-every", "0", "--fail-at-step", "12"};
  auto run = [&](const std::string& name, const std::string& warm) {
    std::vector<std::string> argv = {LAUNCH_BIN, "--nproc-per-node=2", "--max-restarts=1", warm};
    argv.insert(argv.end(), train.begin(), train.end());
    for (const std::string& a : {std::string("--checkpoint-dir"), dir / name, std::string("--stamp-file"),
                                 dir / (name + ".stamps"), std::string("--save-params"), dir / (name + ".bin")})
      argv.push_back(a);
    auto r = RunCmd(argv, {}, std::chrono::seconds(180));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return CachedAtInit(dir / (name + ".stamps"));
  };
  auto warm = run("warm", "--warm-start=true");
  auto cold = run("cold", "--warm-start=false");
  ASSERT_EQ(warm.size(), 4u);
  ASSERT_EQ(cold.size(), 4u);
  for (const char* key : {"0 0", "1 0", "0 1", "1 1"}) {
    EXPECT_GE(warm[key], int64_t{4} * (2 << 20)) << key;
    EXPECT_EQ(cold[key], 0) << key;
  }
  EXPECT_LE(MaxAbsDiff(ReadFloats(dir / "warm.bin"), ReadFloats(dir / "cold.bin")), 1e-6);
}

// Checkpoints kept in launch's memory: a restarted rank resumes from the snapshot its predecessor
// left there, with the optimizer's state whole (the next step's parameters are the same bytes);
// a corrupt memory copy is skipped for the file; a newer file wins over memory.
struct MemoryCase {
  const char* optim;
  const char* which;
  const char* resumed;  // what rank 0 prints
};
class CheckpointMemory : public ::testing::TestWithParam<MemoryCase> {};

TEST_P(CheckpointMemory, ResumesFromTheNewestCopy) {
  const MemoryCase& c = GetParam();
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", "--max-restarts=1", SDK_WORKER_BIN, "ckpt-memory", dir.path(),
                   c.optim, c.which},
                  {}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("[0]:[0] in memory: 1"));
  EXPECT_THAT(r.out, HasSubstr("[1]:[1] a second one in memory: 0"));
  EXPECT_THAT(r.err, HasSubstr("another Checkpointer of this process keeps its snapshots there"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("[0]:[0] resumed from step ", c.resumed)));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("[1]:[1] resumed from step ", c.resumed)));
  if (std::string(c.which) == "corrupt") EXPECT_THAT(r.err, HasSubstr("skipping checkpoint in memory: checksum mismatch"));
  // Resumed from memory that no file held: rank 0 wrote it out again.
  if (std::string(c.which) == "memory") EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/ckpt-0000000003.lck"));
  for (int rank : {0, 1}) {
    const std::string next = ReadFile(dir / absl::StrCat(c.which, ".next.", rank));
    ASSERT_FALSE(next.empty());
    EXPECT_EQ(next, ReadFile(dir / absl::StrCat(c.which, ".resumed.", rank))) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sdk, CheckpointMemory,
    ::testing::Values(MemoryCase{"sgd", "memory", "3 from memory"}, MemoryCase{"adam", "memory", "3 from memory"},
                      MemoryCase{"rmsprop", "memory", "3 from memory"}, MemoryCase{"adagrad", "memory", "3 from memory"},
                      // Not one launch_sdk knows: its state through its own archive.
                      MemoryCase{"own", "memory", "3 from memory"},
                      MemoryCase{"sgd", "corrupt", "3 from disk"}, MemoryCase{"sgd", "disk-newer", "4 from disk"}),
    [](const auto& info) {
      std::string name = std::string(info.param.optim) + "_" + info.param.which;
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// Issue 12's hang: rank 1 sleeps for ever at step 12 of the first attempt while rank 0 waits for it
// in the next allreduce. With --hang-timeout 3 the agent names rank 1 (its stack is outside any
// collective), keeps its stack (gdb) with the sleeping frame, restarts, and the job completes
// from its step-10 checkpoint.
TEST(Sdk, AHungRankIsNamedWithItsStackAndTheJobResumes) {
  if (::access("/usr/bin/gdb", X_OK) != 0) GTEST_SKIP() << "no gdb (scripts/install_deps.sh installs it)";
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", "--max-restarts=1", "--hang-timeout", "3", "--log-dir",
                   dir / "logs", "--rdzv-id", "hang", TRAIN_MLP_BIN, "--dims", "16,32,4", "--steps", "22", "--warmup",
                   "0", "--dataset-size", "256", "--checkpoint-dir", dir / "ckpt", "--checkpoint-every", "5",
                   "--print-every", "0", "--hang-at-step", "12"},
                  {}, std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("fault injection: rank 1 hangs at step 12"));
  EXPECT_THAT(r.err, HasSubstr("rank 1 failed (hung: no step for"));
  EXPECT_THAT(r.err, HasSubstr("HangForever (train_mlp.cc:"));
  EXPECT_THAT(r.out, HasSubstr("resumed from step 10"));
  const std::string stacks = ReadFile(dir / "logs/hang/attempt_0/1/stacks.txt");
  EXPECT_THAT(stacks, HasSubstr("HangForever")) << stacks;
  EXPECT_THAT(stacks, HasSubstr("sleep_for")) << stacks;
}

// With no restart left, a hung rank ends the job with 124 (as timeout(1)) and the table says so.
TEST(Sdk, AHungRankWithNoRestartLeftExits124) {
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=1", "--hang-timeout", "1", TRAIN_MLP_BIN, "--dims", "16,32,4",
                   "--steps", "20", "--warmup", "0", "--print-every", "0", "--hang-at-step", "3", "--fail-rank", "0"},
                  {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex("0 +0 +[0-9]+ +hung .*no step for"));
}

// Whether the LibTorch the SDK was built against autocasts fp16 on the CPU (2.4 and later).
bool CpuFp16Autocast() {
  int major = 0, minor = 0;
  std::sscanf(LAUNCH_TORCH_VERSION, "%d.%d", &major, &minor);
  return major > 2 || (major == 2 && minor >= 4);
}

TEST(Sdk, Fp16KillAndResumeKeepsTheLossScale) {
  if (!CpuFp16Autocast()) GTEST_SKIP() << "LibTorch " << LAUNCH_TORCH_VERSION << " has no fp16 autocast on the CPU";
  // A first scale of 2^24 overflows fp16 gradients, so steps are skipped and the scale backs off:
  // a resumed run that did not restore the scale would skip other steps and end elsewhere.
  auto a = ExpectKillAndResumeMatches({"--amp=fp16", "--init-scale", "16777216"});
  EXPECT_THAT(a.out, HasSubstr("amp fp16 with GradScaler"));
  EXPECT_THAT(a.out, ::testing::ContainsRegex("skipped_steps=[1-9]"));
}

TEST(Sdk, TrainMlpBf16Autocast) {
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", TRAIN_MLP_BIN, "--dims", "16,32,4", "--steps", "10", "--warmup",
                   "0", "--amp"},
                  {}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("amp bf16\n"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("done: steps=10 loss=[0-9]"));
}

TEST(Sdk, TrainMlpFp16WhereTheCpuCannot) {
  if (CpuFp16Autocast()) GTEST_SKIP() << "LibTorch " << LAUNCH_TORCH_VERSION << " autocasts fp16 on the CPU";
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=1", TRAIN_MLP_BIN, "--dims", "16,32,4", "--steps", "3", "--amp=fp16"},
                  {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("Half on cpu: expected BFloat16"));
}

TEST(Sdk, TrainMlpRejectsAnUnknownAmpDtype) {
  auto r = RunCmd({TRAIN_MLP_BIN, "--amp=fp8"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("fp8"));
}

// Debian's LibTorch 2.x has no libuv TCPStore while 2.4+ asks for one by default: without
// USE_LIBUV=0 the SDK must still start (a Python script there needs USE_LIBUV=0).
TEST(Sdk, StartsWithoutUseLibuvWhateverTheTcpStoreBackend) {
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", TRAIN_MLP_BIN, "--dims", "16,32,4", "--steps", "3", "--warmup", "0"},
                  {"USE_LIBUV"}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:done: steps=3"));
}

TEST(Sdk, UncaughtExceptionWritesTheErrorFile) {
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=1", SDK_WORKER_BIN, "throw", "the optimizer diverged"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("std::runtime_error: the optimizer diverged   <- root cause"));
}

TEST(Sdk, FatalSignalWritesTheErrorFile) {
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=1", "--log-dir", dir.path(), "--rdzv-id", "s", SDK_WORKER_BIN, "segv"});
  EXPECT_EQ(r.exit_code, 128 + 11) << r.err;
  EXPECT_THAT(r.err, HasSubstr("Fatal signal 11 (SIGSEGV)"));
  // The file is valid JSON for Python's json module too.
  auto py = RunCmd({"/usr/bin/python3", "-c", "import json,sys; print(json.load(open(sys.argv[1]))['message']['message'])",
                    dir.path() + "/s/attempt_0/0/error.json"});
  EXPECT_EQ(py.out, "Fatal signal 11 (SIGSEGV)\n") << py.err;
}

TEST(Sdk, ProfilerWritesAChromeTracePerRank) {
  TempDir dir;
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", "--log-dir", dir.path(), "--rdzv-id", "p", TRAIN_MLP_BIN,
                   "--dims", "16,32,4", "--steps", "6", "--warmup", "0", "--print-every", "0"},
                  {"LAUNCH_PROFILE_STEPS=2-3"}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank : {0, 1}) {
    std::string trace = dir.path() + "/p/attempt_0/" + std::to_string(rank) + "/trace_rank" + std::to_string(rank) + ".json";
    std::string text = ReadFile(trace);
    EXPECT_THAT(text, HasSubstr("\"ph\"")) << trace;
    auto py = RunCmd({"/usr/bin/python3", "-c", "import json,sys; e=json.load(open(sys.argv[1])); print(len(e) > 0)", trace});
    EXPECT_EQ(py.out, "True\n") << py.err;
  }
}

std::string DoneLine(const std::string& out) {
  auto at = out.find("[0]:done: ");
  return at == std::string::npos ? "" : out.substr(at, out.find(" measured_steps", at) - at);
}

TEST(Sdk, PythonDdpTwinTrainsTheSameUnderLaunch) {
  LAUNCH_NEED_PYTHON_TORCH();
  std::vector<std::string> flags = {"--dims", "16,32,4", "--batch", "8", "--steps", "30", "--warmup", "2",
                                    "--dataset-size", "128", "--print-every", "0"};
  std::vector<std::string> py = {LAUNCH_BIN, "--nproc-per-node=2", std::string(SOURCE_DIR) + "/examples/python/train_ddp.py"};
  std::vector<std::string> cc = {LAUNCH_BIN, "--nproc-per-node=2", TRAIN_MLP_BIN};
  py.insert(py.end(), flags.begin(), flags.end());
  cc.insert(cc.end(), flags.begin(), flags.end());
  auto p = RunCmd(py, PythonTorchEnv(), std::chrono::seconds(120));
  auto c = RunCmd(cc, {}, std::chrono::seconds(120));
  ASSERT_EQ(p.exit_code, 0) << p.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_THAT(p.out, HasSubstr("steps_per_s="));
  // Same data, sampler, model and optimizer: the same final loss to six digits.
  EXPECT_EQ(DoneLine(p.out), DoneLine(c.out)) << p.out << c.out;
  EXPECT_FALSE(DoneLine(c.out).empty());
}

TEST(Sdk, ExampleConfigsAreValid) {
  // Paths in the configs are relative to the repository root.
  auto r = RunCmd({"/bin/sh", "-c", std::string("cd ") + SOURCE_DIR + " && " + LAUNCH_BIN +
                                        " --config examples/configs/train_mlp.yaml --dry-run && " +
                                        "PYTHON_EXEC=/usr/bin/python3 " + LAUNCH_BIN +
                                        " --config examples/configs/train_ddp.yaml --dry-run"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("LAUNCH_LR=0.02"));  // base_lr 0.01 x 2 workers, linear
  EXPECT_THAT(r.out, HasSubstr("train_ddp.py --steps 100"));
}

TEST(Sdk, TrainMlpPrintsStepsPerSecond) {
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=2", TRAIN_MLP_BIN, "--dims", "16,32,4", "--steps", "30", "--warmup", "5"},
                  {}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("measured_steps=25 steps_per_s="));
}

}  // namespace
}  // namespace launch::testing
