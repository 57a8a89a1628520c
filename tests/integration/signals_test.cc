// Signals to the real `launch` and its workers: forwarding, the stop grace and its second
// signal, torchrun's --signals-to-handle, Slurm's warning, kill -9, and what workers inherit.

#include <signal.h>

#include <chrono>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Launch, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  TempDir dir;
  auto start = std::chrono::steady_clock::now();
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--stop-timeout=0.5"},
                   {"--ignore-sigterm", "--pid-file", dir / "ready", "--wait-lines", dir / "ready", "2",
                    "--fail-rank", "1", "4", "--sleep", "0"}));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("sending SIGKILL"));
  EXPECT_THAT(r.err, HasSubstr("SIGKILL"));
  EXPECT_LT(took, std::chrono::seconds(20));
}

TEST(Launch, Kill9OfLaunchLeavesNoWorkerOrGrandchild) {
  TempDir dir;
  Child launch(Cmd({"--nproc-per-node=2"},
                   {"--pid-file", dir / "workers", "--grandchild", dir / "grandchildren", "--sleep", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    launch.Pump(1);
    return ReadPids(dir / "workers").size() == 2 && ReadPids(dir / "grandchildren").size() == 2;
  }));
  std::vector<pid_t> pids = ReadPids(dir / "workers");
  for (pid_t p : ReadPids(dir / "grandchildren")) pids.push_back(p);
  ASSERT_FALSE(AllDead(pids));
  kill(launch.pid(), SIGKILL);
  auto r = launch.Wait();
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return AllDead(pids); })) << "a worker or grandchild survived";
}

TEST(Launch, SigtermIsForwardedAndExitIs143) {
  TempDir dir;
  Child launch(Cmd({"--nproc-per-node=2"}, {"--pid-file", dir / "workers", "--sleep", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    launch.Pump(1);
    return ReadPids(dir / "workers").size() == 2;
  }));
  kill(launch.pid(), SIGTERM);
  auto r = launch.Wait();
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_THAT(r.err, HasSubstr("got SIGTERM"));
  EXPECT_TRUE(AllDead(ReadPids(dir / "workers")));
}

// Workers that ignore `sig`, a 60 s grace: the second `sig` to launch kills them at once.
void ExpectSecondSignalKillsAtOnce(int sig, const std::string& name) {
  TempDir dir;
  auto start = std::chrono::steady_clock::now();
  Child launch(Cmd({"--nproc-per-node=2", "--stop-timeout=60"},
                   {"--ignore", std::to_string(sig), "--pid-file", dir / "workers", "--sleep", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    launch.Pump(1);
    return ReadPids(dir / "workers").size() == 2;
  }));
  kill(launch.pid(), sig);
  ASSERT_TRUE(WaitUntil([&] {
    launch.Pump(1);
    return absl::StrContains(launch.err(), "got " + name);
  }));
  kill(launch.pid(), sig);
  auto r = launch.Wait(std::chrono::seconds(30));
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
  EXPECT_THAT(r.err, HasSubstr(name + " while stopping: killing the workers now"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_TRUE(AllDead(ReadPids(dir / "workers")));
}

TEST(Launch, SecondSigintKillsAtOnce) { ExpectSecondSignalKillsAtOnce(SIGINT, "SIGINT"); }

// The first SIGTERM's log line says "again to kill at once"; it used to take the whole grace.
TEST(Launch, SecondSigtermKillsAtOnce) { ExpectSecondSignalKillsAtOnce(SIGTERM, "SIGTERM"); }

// Two workers running under `flags` (and `env`); `sig` to launch. Returns launch's result.
RunResult SignalRunningLaunch(const std::vector<std::string>& flags, const std::vector<std::string>& env, int sig,
                              const TempDir& dir) {
  std::vector<std::string> all = flags;
  all.push_back("--nproc-per-node=2");
  Child launch(Cmd(all, {"--pid-file", dir / "workers", "--sleep", "0"}), env);
  EXPECT_TRUE(WaitUntil([&] {
    launch.Pump(1);
    return ReadPids(dir / "workers").size() == 2;
  }));
  kill(launch.pid(), sig);
  return launch.Wait(std::chrono::seconds(30));
}

// torchrun's --signals-to-handle: a signal named there reaches the workers, which are then stopped,
// and launch exits 128+signal.
TEST(Launch, SignalsToHandleForwardsTheNamedSignals) {
  TempDir dir;
  auto r = SignalRunningLaunch({"--signals-to-handle=SIGTERM,SIGUSR1"}, {}, SIGUSR1, dir);
  EXPECT_EQ(r.exit_code, 128 + SIGUSR1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("got SIGUSR1: forwarding it to the workers"));
  EXPECT_THAT(r.err, HasSubstr("SIGUSR1"));  // the workers' end in the table
  EXPECT_TRUE(WaitUntil([&] { return AllDead(ReadPids(dir / "workers")); }));
}

// A signal not named ends launch as it would any program that does not handle it, and the orphan
// guard takes its workers with it.
TEST(Launch, AnUnhandledSignalEndsLaunchAndItsWorkers) {
  TempDir dir;
  auto r = SignalRunningLaunch({"--signals-to-handle=SIGTERM"}, {}, SIGINT, dir);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("got SIGINT")));
  EXPECT_TRUE(WaitUntil([&] { return AllDead(ReadPids(dir / "workers")); })) << "a worker survived launch";
}

// In a Slurm job step, `sbatch --signal=USR1@60` warns the tasks ahead of the time limit: launch
// passes SIGUSR1 to its workers by default there, instead of dying of it.
TEST(Launch, InASlurmStepSigusr1ReachesTheWorkers) {
  TempDir dir;
  auto r = SignalRunningLaunch({}, {"SLURM_JOB_ID=77", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_NODES=1",
                                    "SLURM_NODEID=0", "SLURM_STEP_NODELIST=localhost", "SLURM_STEP_NUM_TASKS=1"},
                               SIGUSR1, dir);
  EXPECT_EQ(r.exit_code, 128 + SIGUSR1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("got SIGUSR1: forwarding it to the workers"));
  EXPECT_THAT(r.err, HasSubstr("run '77.0'"));
  EXPECT_TRUE(WaitUntil([&] { return AllDead(ReadPids(dir / "workers")); }));
}

// Signals ignored when launch was started (nohup) stay ignored in the workers, as exec keeps them;
// launch's own handling (its blocked signals, its ignored SIGPIPE) does not reach them.
TEST(Launch, InheritedIgnoredSignalsReachTheWorkers) {
  auto r = RunCmd({"/bin/sh", "-c", "trap '' HUP USR2; exec \"$0\" \"$@\"", kLaunch, "--nproc-per-node=1", kWorker,
                   "--print-ignored"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:ignored SIGHUP SIGUSR2\n"));
  auto plain = RunCmd({kLaunch, "--nproc-per-node=1", kWorker, "--print-ignored"});
  EXPECT_THAT(plain.out, HasSubstr("[0]:ignored\n"));
}

}  // namespace
}  // namespace launch::testing
