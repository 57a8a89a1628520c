// The worker group under the real `launch`: the workers' environment and descriptors, exit
// codes, restarts, error files and the summary.

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Launch, TwoWorkersGetTorchrunEnvironmentAndPrefixedOutput) {
  auto r = RunCmd(Cmd({"--nproc-per-node=2"},
                   {"--print-env", "RANK,LOCAL_RANK,WORLD_SIZE,LOCAL_WORLD_SIZE,GROUP_RANK,ROLE_NAME,"
                                   "MASTER_ADDR,TORCHELASTIC_RESTART_COUNT"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank : {0, 1}) {
    std::string p = "[" + std::to_string(rank) + "]:";
    EXPECT_THAT(r.out, HasSubstr(p + "RANK=" + std::to_string(rank) + "\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "LOCAL_RANK=" + std::to_string(rank) + "\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "WORLD_SIZE=2\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "LOCAL_WORLD_SIZE=2\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "GROUP_RANK=0\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "ROLE_NAME=default\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "MASTER_ADDR=127.0.0.1\n"));
    EXPECT_THAT(r.out, HasSubstr(p + "TORCHELASTIC_RESTART_COUNT=0\n"));
  }
}

TEST(Launch, LocalRankPlaceholderIsReplacedPerWorker) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2"}, {"--pid-file", dir / "pid.${local_rank}"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadPids(dir / "pid.0").size(), 1u);
  EXPECT_EQ(ReadPids(dir / "pid.1").size(), 1u);
}

TEST(Launch, ExitsWithTheRootCauseWorkersCodeAndSummarizes) {
  auto r = RunCmd(Cmd({"--nproc-per-node=2"},
                   {"--stderr", "about to fail", "--fail-rank", "1", "3", "--sleep", "0"}));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("worker group failed"));
  EXPECT_THAT(r.err, HasSubstr("exit 3"));
  EXPECT_THAT(r.err, HasSubstr("<- root cause"));
  EXPECT_THAT(r.err, HasSubstr("[1] stderr: about to fail"));
  EXPECT_THAT(r.err, HasSubstr("SIGTERM"));  // rank 0 was stopped
}

TEST(Launch, ProgressReportsReachTheAgent) {
  auto r = RunCmd(Cmd({"--nproc-per-node=2"}, {"--progress", "17", "--fail-rank", "1", "5", "--sleep", "0"}));
  EXPECT_EQ(r.exit_code, 5) << r.err;
  // The failed rank's row names the last step it reported.
  bool found = false;
  for (const auto& l : Lines(r.err)) found |= absl::StrContains(l, "exit 5") && absl::StrContains(l, " 17 ");
  EXPECT_TRUE(found) << r.err;
}

// --hang-timeout on workers that report no steps did nothing without a word.
TEST(Launch, AHangTimeoutWithoutStepsIsSaidOnce) {
  Child c(Cmd({"--nproc-per-node=2", "--hang-timeout=0.3"}, {"--sleep", "0"}));
  EXPECT_TRUE(WaitUntil([&] {
    c.Pump(10);
    return absl::StrContains(c.err(), "--hang-timeout=0.3: no rank has reported a step in that time");
  })) << c.err();
  ::kill(c.pid(), SIGTERM);
  auto r = c.Wait();
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_EQ(CountLines(r.err, "no rank has reported a step"), 1) << r.err;
  auto stepping = RunCmd(Cmd({"--nproc-per-node=1", "--hang-timeout=5"}, {"--progress", "3", "--exit", "0"}));
  EXPECT_EQ(stepping.exit_code, 0) << stepping.err;
  EXPECT_THAT(stepping.err, Not(HasSubstr("no rank has reported a step")));
  auto automatic = RunCmd(Cmd({"--nproc-per-node=1"}, {"--exit", "0"}));
  EXPECT_THAT(automatic.err, Not(HasSubstr("no rank has reported a step")));
}

TEST(Launch, KilledWorkerExitCodeIs128PlusSignal) {
  auto r = RunCmd(Cmd({"--nproc-per-node=1"}, {"--kill-self", "9"}));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_THAT(r.err, HasSubstr("SIGKILL"));
}

TEST(Launch, ErrorFileMessageAppearsInSummary) {
  auto r = RunCmd(Cmd({"--nproc-per-node=2"},
                   {"--fail-rank", "0", "0", "--error-file", "ValueError: the real cause", "--exit", "1"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("ValueError: the real cause"));
}

// The agent's store serves every attempt on one port (each attempt starts it empty).
TEST(Launch, RestartsUntilSuccessOnTheAgentsStoreAndCounts) {
  // One worker: a failing worker stops its peers, which may not have printed yet.
  auto r = RunCmd(Cmd({"--nproc-per-node=1", "--max-restarts=3"},
                   {"--print-env", "TORCHELASTIC_RESTART_COUNT,MASTER_PORT,TORCHELASTIC_USE_AGENT_STORE",
                    "--fail-below-restart", "2", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountLines(r.err, "restarting the group"), 2) << r.err;
  for (int k = 0; k <= 2; ++k) {
    EXPECT_EQ(CountLines(r.out, "TORCHELASTIC_RESTART_COUNT=" + std::to_string(k)), 1) << r.out;
  }
  std::set<std::string> ports;
  for (const auto& l : Lines(r.out))
    if (absl::StrContains(l, "MASTER_PORT=")) ports.insert(l.substr(l.find('=') + 1));
  EXPECT_EQ(ports.size(), 1u) << "the agent's store, on one MASTER_PORT for every attempt: " << r.out;
  EXPECT_EQ(CountLines(r.out, "TORCHELASTIC_USE_AGENT_STORE=True"), 3) << r.out;
  EXPECT_THAT(r.err, Not(HasSubstr("internal"))) << "an illegal supervisor transition";
}

TEST(Launch, RestartBudgetExhaustedExitsWithWorkerCode) {
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--max-restarts=2"}, {"--fail-rank", "1", "7", "--sleep", "0"}));
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_EQ(CountLines(r.err, "restarting the group"), 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("restart budget exhausted"));
  EXPECT_THAT(r.err, Not(HasSubstr("internal"))) << "an illegal supervisor transition";
}

TEST(Launch, WorkerLeftoverChildrenAreStoppedAtTheEnd) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=1"}, {"--grandchild", dir / "gc", "--exit", "0"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("left processes in its group"));
  EXPECT_TRUE(AllDead(ReadPids(dir / "gc")));
}

TEST(Launch, UsersMklThreadsAreKeptAndOmpThreadsStayWithinTheCpus) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  auto r = RunCmd(Cmd({"--nproc-per-node=1"}, {"--print-env", "OMP_NUM_THREADS,MKL_NUM_THREADS"}),
               {"MKL_NUM_THREADS=3", "OMP_NUM_THREADS"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("MKL_NUM_THREADS=3"));
  EXPECT_THAT(r.err, HasSubstr("kept the user's MKL_NUM_THREADS=3"));
  // affinity may be narrower than the online count, never wider
  int omp = std::stoi(r.out.substr(r.out.find("OMP_NUM_THREADS=") + 16));
  EXPECT_GE(omp, 1);
  EXPECT_LE(omp, cpus);
}

// A start failure part-way through (it was running out of descriptors, which launch now checks
// before it starts anything) left the workers already started running, and exited 2, "bad input".
// Here local rank 3's program does not exist ("${local_rank}" in the program's path): ranks 0-2
// are killed and reaped, and launch exits 1.
TEST(Launch, WorkersStartedBeforeAStartFailureAreStopped) {
  TempDir dir;
  for (const std::string name : {"w${local_rank}", "w0", "w1", "w2"}) {
    ASSERT_EQ(::symlink(kWorker.c_str(), (dir / name).c_str()), 0) << name;
  }
  auto r = RunCmd({kLaunch, "--nproc-per-node=4", dir / "w${local_rank}", "--pid-file", dir / "pids", "--sleep", "0"},
                  {}, std::chrono::seconds(30));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot run the workers: cannot start '" + dir / "w3" + "'"));
  // No process of the three started workers is left (found by their command lines).
  EXPECT_EQ(ProcessesWithArg(dir / "pids"), std::vector<pid_t>{});
}

// An fd 7 opened by the calling shell reached the worker; torchrun's workers have only 0, 1, 2.
TEST(Launch, WorkersGetOnlyStdioAndTheProgressFd) {
  auto r = RunCmd({"/bin/sh", "-c", "exec 7</dev/null 9>/dev/null; exec \"$0\" \"$@\"", kLaunch, "--nproc-per-node=2",
                   kWorker, "--print-fds"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:fds 0 1 2 3\n"));  // 3: LAUNCH_PROGRESS_FD
  EXPECT_THAT(r.out, HasSubstr("[1]:fds 0 1 2 3\n"));
}

// torchrun copies the root cause's error file to its own TORCHELASTIC_ERROR_FILE (schedulers read
// it), with the exit code as the message's errorCode; launch wrote nothing there, then no errorCode.
TEST(Launch, OwnErrorFileGetsTheRootCause) {
  TempDir dir;
  const std::string own = dir / "launch_error.json";
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", kWorker, "--fail-rank", "1", "7", "--sleep", "0"},
                  {"TORCHELASTIC_ERROR_FILE=" + own});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_THAT(ReadFile(own), HasSubstr("\"message\":\"rank 1 (local rank 1) on "));
  EXPECT_THAT(ReadFile(own), HasSubstr(": exit 7\""));
  EXPECT_THAT(ReadFile(own), HasSubstr("\"errorCode\":7"));
  auto with = RunCmd({kLaunch, "--nproc-per-node=2", kWorker, "--exit-if-env", "RANK", "0", "0", "--error-file",
                      "ValueError: bad batch", "--exit", "3"},
                     {"TORCHELASTIC_ERROR_FILE=" + own});
  EXPECT_EQ(with.exit_code, 3) << with.err;
  EXPECT_THAT(ReadFile(own), HasSubstr("\"message\":\"ValueError: bad batch\""));
  EXPECT_THAT(ReadFile(own), HasSubstr("\"errorCode\":3"));
}

}  // namespace
}  // namespace launch::testing
