// torchrun's file timer under the real `launch` (TORCHELASTIC_ENABLE_FILE_TIMER), with torch's own
// client in Python workers.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// torchrun's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1) with torch's own client: rank 1 takes a
// 1 s timer and sleeps for an hour; launch kills it with the timer's signal (SIGKILL) at once, the
// table names it as the root cause, and the FIFO is gone at the end.
TEST(Launch, APythonWorkerPastItsFileTimerIsKilledWithItsSignal) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/file_timer.py", "expire"},
                  {"PYTHON_EXEC=/usr/bin/python3", "TORCHELASTIC_ENABLE_FILE_TIMER=1",
                   "TORCHELASTIC_TIMER_FILE=" + dir / "timer"},
                  std::chrono::seconds(120));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[1]:in the timed scope"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("timer \"stuck step\" of pid [0-9]+ \\(rank 1\\) expired: sent SIGKILL"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("  1 +1 +[0-9]+ +SIGKILL .*<- root cause"));
  EXPECT_LT(took, std::chrono::seconds(60)) << "the worker was to sleep for an hour";
  EXPECT_NE(::access((dir / "timer").c_str(), F_OK), 0) << "the FIFO outlived the run";
}

// Workers that leave their timed scopes in time run to the end; without TORCHELASTIC_TIMER_FILE
// the FIFO is a fresh one in TMPDIR, given to every worker, and removed at the end.
TEST(Launch, PythonWorkersThatReleaseTheirFileTimersInTimeExit0) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/file_timer.py", "release"},
                  {"PYTHON_EXEC=/usr/bin/python3", "TORCHELASTIC_ENABLE_FILE_TIMER=1", "TORCHELASTIC_TIMER_FILE=",
                   "TMPDIR=" + dir.path()},
                  std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0 released in time"));
  EXPECT_THAT(r.out, HasSubstr("[1]:rank 1 released in time"));
  EXPECT_THAT(r.err, HasSubstr("file timer: the workers' timers go through " + dir.path() + "/watchdog_timer_"));
  EXPECT_THAT(r.err, Not(HasSubstr("expired")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "the FIFO outlived the run";
}

// A TORCHELASTIC_TIMER_FILE that is no FIFO of the user's is left alone, and nothing starts.
TEST(Launch, AFileTimerPathThatIsNotAFifoIsBadInput) {
  TempDir dir;
  WriteFile(dir / "timer", "keep me");
  auto r = RunCmd(Cmd({"--nproc-per-node=1"}, {"--print-env", "RANK"}),
                  {"TORCHELASTIC_ENABLE_FILE_TIMER=1", "TORCHELASTIC_TIMER_FILE=" + dir / "timer"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("TORCHELASTIC_TIMER_FILE: " + dir / "timer" + " exists and is not a FIFO of this user's"));
  EXPECT_THAT(r.out, Not(HasSubstr("RANK=")));
  EXPECT_EQ(ReadFile(dir / "timer"), "keep me");
}

}  // namespace
}  // namespace launch::testing
