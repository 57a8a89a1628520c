// Exit notices (agent/exit_notices.h, launch_sdk/exit_notice.h): real test workers hold their
// slots and exit; the agent's watcher says which failed, with what status, and before the kernel
// has torn the worker down.
#include "agent/exit_notices.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "agent/group_supervisor.h"
#include "probes/process.h"
#include "probes/signals.h"
#include "agent/worker_group.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch_sdk/exit_notice.h"
#include "tests/test_util.h"

namespace launch {
namespace {

using testing::Child;
using testing::ReadPids;
using testing::TempDir;
using testing::WaitUntil;

const std::string kWorker = TEST_WORKER_BIN;

class ExitNoticesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = ExitNotices::Create(2);
    ASSERT_TRUE(n.ok()) << n.status();
    notices_ = std::move(*n);
  }
  std::vector<std::string> Env(int local_rank) const {
    return {absl::StrCat(launch_sdk::kExitNoticeEnv, "=", notices_->EnvValue()), absl::StrCat("LOCAL_RANK=", local_rank)};
  }
  // The notices that came within `timeout` (none: an empty list once it ran out).
  std::vector<ExitNotices::Notice> Await(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    pollfd p{notices_->fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return {};
    return notices_->Take();
  }
  // A worker in slot `local_rank` that holds its notice once `go` has one line, appends its pid
  // to `pids`, then does `then` once `go` has two lines.
  std::unique_ptr<Child> Start(const TempDir& dir, int local_rank, std::vector<std::string> then,
                               const std::string& how = "--hold-exit-notice") {
    const std::string go = dir / absl::StrCat("go", local_rank);
    std::vector<std::string> argv = {kWorker, "--wait-lines", go, "1", how, "--pid-file", dir / absl::StrCat("pids", local_rank),
                                     "--wait-lines", go, "2"};
    argv.insert(argv.end(), then.begin(), then.end());
    return std::make_unique<Child>(argv, Env(local_rank));
  }
  static void Go(const TempDir& dir, int local_rank) {
    const std::string go = dir / absl::StrCat("go", local_rank);
    testing::WriteFile(go, testing::ReadFile(go) + "go\n");
  }
  static bool Held(const TempDir& dir, int local_rank) {
    return WaitUntil([&] { return ReadPids(dir / absl::StrCat("pids", local_rank)).size() == 1; });
  }
  std::unique_ptr<ExitNotices> notices_;
};

TEST_F(ExitNoticesTest, AFailingExitIsNoticedWithItsStatusWhetherWatchedBeforeOrAfterTheHold) {
  TempDir dir;
  auto before = Start(dir, 0, {"--exit", "3"});
  notices_->Watch(0, before->pid());  // before it holds its slot
  Go(dir, 0);
  ASSERT_TRUE(Held(dir, 0));
  Go(dir, 0);
  std::vector<ExitNotices::Notice> got = Await();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].local_rank, 0);
  EXPECT_EQ(got[0].pid, before->pid());
  EXPECT_TRUE(WIFEXITED(got[0].status) && WEXITSTATUS(got[0].status) == 3) << got[0].status;
  EXPECT_EQ(before->Wait().exit_code, 3);

  auto after = Start(dir, 1, {"--kill-self", "6"});
  Go(dir, 1);
  ASSERT_TRUE(Held(dir, 1));
  notices_->Watch(1, after->pid());  // once it holds it
  Go(dir, 1);
  got = Await();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].local_rank, 1);
  EXPECT_TRUE(WIFSIGNALED(got[0].status) && WTERMSIG(got[0].status) == SIGABRT) << got[0].status;
  EXPECT_EQ(after->Wait().exit_code, 128 + SIGABRT);
}

// The point of the notice: a killed worker with 512 MiB to free is noticed while the kernel still
// frees it, before the worker can be reaped. (Up to three tries: the watcher thread could be kept
// off the CPU for the whole teardown on a loaded machine.)
TEST_F(ExitNoticesTest, AKilledWorkerIsNoticedBeforeItCanBeReaped) {
  int before_reapable = 0;
  for (int attempt = 0; attempt < 3 && before_reapable == 0; ++attempt) {
    TempDir dir;
    auto w = Start(dir, 1, {"--touch", "512", "--kill-self", "9"});
    Go(dir, 1);
    notices_->Watch(1, w->pid());
    ASSERT_TRUE(Held(dir, 1));
    Go(dir, 1);
    std::vector<ExitNotices::Notice> got = Await();
    siginfo_t info{};
    const bool exited = ::waitid(P_PID, static_cast<id_t>(w->pid()), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0;
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].pid, w->pid());
    EXPECT_TRUE(WIFSIGNALED(got[0].status) && WTERMSIG(got[0].status) == SIGKILL) << got[0].status;
    if (!exited) ++before_reapable;
    EXPECT_EQ(w->Wait().exit_code, 128 + SIGKILL);
  }
  EXPECT_EQ(before_reapable, 1);
}

// No notice for: an exit with status 0, a slot held by a process that is not the watched one, a
// holder thread that ended alone (the process then fails without its notice), or a worker no
// longer watched after Clear. Each is followed by a failing worker whose notice is the only one.
TEST_F(ExitNoticesTest, OnlyAWatchedWorkersFailingExitIsNoticed) {
  struct Case {
    int local_rank;
    int code;
    bool watched_as_itself;
    const char* how;
    bool cleared;
    bool noticed;
  };
  const Case cases[] = {
      {0, 0, true, "--hold-exit-notice", false, false},           {1, 4, false, "--hold-exit-notice", false, false},
      {0, 6, true, "--hold-exit-notice-in-thread", false, false}, {1, 5, true, "--hold-exit-notice", false, true},
      {1, 7, true, "--hold-exit-notice", true, false},            {0, 8, true, "--hold-exit-notice", false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("the worker that exits " + std::to_string(c.code));
    TempDir dir;
    auto w = Start(dir, c.local_rank, {"--exit", std::to_string(c.code)}, c.how);
    notices_->Watch(c.local_rank, c.watched_as_itself ? w->pid() : ::getpid());
    Go(dir, c.local_rank);
    ASSERT_TRUE(Held(dir, c.local_rank));
    if (c.cleared) notices_->Clear();
    Go(dir, c.local_rank);
    if (c.noticed) {
      std::vector<ExitNotices::Notice> got = Await();
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].pid, w->pid());
      EXPECT_EQ(WEXITSTATUS(got[0].status), c.code);
    }
    EXPECT_EQ(w->Wait().exit_code, c.code);
  }
}

// A slot held by a live process is not taken (a child with its parent's environment), and a
// worker cannot resize the file under the agent's mapping (which would kill launch with SIGBUS).
TEST_F(ExitNoticesTest, AHeldSlotIsLeftToItsHolderAndTheFileKeepsItsSize) {
  TempDir dir;
  auto w = Start(dir, 0, {"--exit", "0"});
  Go(dir, 0);
  ASSERT_TRUE(Held(dir, 0));
  std::string why;
  EXPECT_FALSE(launch_sdk::HoldExitNotice(notices_->EnvValue(), 0, &why));
  EXPECT_EQ(why, absl::StrCat("local rank 0's slot in ", notices_->EnvValue(), " is held by process ", w->pid()));
  EXPECT_FALSE(launch_sdk::HoldsExitNotice());
  const int fd = ::open(notices_->EnvValue().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_NE(::ftruncate(fd, 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(fd, 1 << 20), 0);
  ::close(fd);
  Go(dir, 0);
  EXPECT_EQ(w->Wait().exit_code, 0);
}

TEST(ExitNotices, TooManyLocalRanksAreRefused) {
  auto n = ExitNotices::Create(ExitNotices::kMaxLocalRanks + 1);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().message(), "64 local ranks: exit notices are kept for 1 to 63");
}

TEST(ExitNotice, AFileThatCannotBeUsedIsNamedAndNothingIsHeld) {
  std::string why;
  EXPECT_FALSE(launch_sdk::HoldExitNotice("/nonexistent/notice", 0, &why));
  EXPECT_EQ(why, "cannot open /nonexistent/notice: No such file or directory");
  TempDir dir;
  testing::WriteFile(dir / "small", std::string(sizeof(launch_sdk::ExitNoticeSlot), '\0'));
  EXPECT_FALSE(launch_sdk::HoldExitNotice(dir / "small", 1, &why));
  EXPECT_EQ(why, absl::StrCat(dir / "small", " holds ", sizeof(launch_sdk::ExitNoticeSlot),
                              " bytes: no slot for local rank 1"));
  EXPECT_FALSE(launch_sdk::HoldExitNotice(dir / "small", -1, &why));
  EXPECT_EQ(why, "local rank -1 is outside 0..4095");
  EXPECT_FALSE(launch_sdk::HoldsExitNotice());
}

TEST(ExitNoticeSupervisor, AFailingWorkerStopsTheGroupOnceAndRunsUntilReaped) {
  const StopEscalation stop = StopEscalation::TermThenKill(std::chrono::milliseconds(5000));
  SupervisorState s;
  s.running = 2;
  SupervisorStep a = Supervise(stop, s, SupervisorEvent::Failing(1));
  EXPECT_EQ(a.state.phase, SupervisorState::Phase::kStopping);
  EXPECT_EQ(a.state.end, GroupEnd::kFailed);
  EXPECT_EQ(a.state.root_cause, 1);
  EXPECT_EQ(a.state.running, 2);  // it is not reaped yet
  EXPECT_EQ(a.actions.signal_groups, SIGTERM);
  EXPECT_EQ(a.actions.report_failure, 1);
  SupervisorStep b = Supervise(stop, a.state, SupervisorEvent::Exited(1, true));
  EXPECT_EQ(b.state.running, 1);
  EXPECT_EQ(b.actions.report_failure, -1);  // said once
  EXPECT_EQ(b.actions.signal_groups, 0);
  EXPECT_EQ(b.state.root_cause, 1);
}

// A group of real workers: rank 1 kills itself and is the root cause, seen from its notice (it
// has 512 MiB to free; up to three tries, as above); the other is stopped as for any failure.
TEST_F(ExitNoticesTest, AGroupStopsOnANoticeAndNamesTheWorker) {
  BlockLauncherSignals();
  auto signals = SignalFd::Create();
  ASSERT_TRUE(signals.ok());
  PosixProcessLauncher launcher;
  SystemClock clock;
  int noticed = 0;
  for (int attempt = 0; attempt < 3 && noticed == 0; ++attempt) {
    TempDir dir;
    std::vector<WorkerLaunch> launches(2);
    for (int i = 0; i < 2; ++i) {
      launches[i].local_rank = i;
      launches[i].rank = i;
      launches[i].env = Env(i);
      launches[i].argv = {kWorker, "--hold-exit-notice", "--pid-file", dir / "pids", "--wait-lines", dir / "pids", "2"};
      if (i == 1) {
        launches[i].argv.insert(launches[i].argv.end(), {"--touch", "512", "--kill-self", "9"});
      } else {
        launches[i].argv.insert(launches[i].argv.end(), {"--sleep", "0"});
      }
    }
    WorkerGroup::Options o;
    o.stdin_fd = -1;
    o.exit_notices = notices_.get();
    WorkerGroup group(o, &launcher, nullptr, &*signals, &clock);
    auto outcome = group.Run(launches);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->kind, GroupEnd::kFailed);
    EXPECT_EQ(outcome->root_cause, 1);
    EXPECT_EQ(outcome->workers[1].signal, SIGKILL);
    EXPECT_EQ(outcome->workers[0].signal, SIGTERM);
    if (outcome->workers[1].exit_noticed) ++noticed;
    EXPECT_TRUE(notices_->Take().empty());  // the group watches nothing once it ends
  }
  EXPECT_EQ(noticed, 1);
}

}  // namespace
}  // namespace launch
