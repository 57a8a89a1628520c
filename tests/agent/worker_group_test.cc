// The worker group's supervision without processes: the pure supervisor as sequences of events,
// and WorkerGroup driven through a fake process launcher (no fork, no sleeps).
#include "agent/worker_group.h"

#include <signal.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>

#include "agent/group_supervisor.h"
#include "launch_sdk/progress.h"
#include "tests/test_util.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_process_launcher.h"

namespace launch {
namespace {

using std::chrono::milliseconds;
using testing::FakeProcessLauncher;
using testing::TempDir;
using Phase = SupervisorState::Phase;

// ---- The pure supervisor ----

struct Sequence {
  StopEscalation stop = StopEscalation::TermThenKill(milliseconds(5000));
  SupervisorState state;
  std::vector<SupervisorActions> actions;
  explicit Sequence(int workers) { state.running = workers; }
  const SupervisorActions& Feed(const SupervisorEvent& e) {
    SupervisorStep step = Supervise(stop, state, e);
    state = step.state;
    actions.push_back(step.actions);
    return actions.back();
  }
};

TEST(Supervisor, AFailureStopsTheGroupWithTheFirstStepAndReportsItOnce) {
  Sequence r(3);
  const SupervisorActions a = r.Feed(SupervisorEvent::Exited(1, true));
  EXPECT_EQ(r.state.phase, Phase::kStopping);
  EXPECT_EQ(r.state.end, GroupEnd::kFailed);
  EXPECT_EQ(r.state.root_cause, 1);
  EXPECT_EQ(a.signal_groups, SIGTERM);
  ASSERT_TRUE(a.arm_grace.has_value());
  EXPECT_EQ(*a.arm_grace, milliseconds(5000));
  EXPECT_EQ(a.report_failure, 1);
  // A second failure while stopping is not the root cause and is not reported.
  const SupervisorActions b = r.Feed(SupervisorEvent::Exited(0, true));
  EXPECT_EQ(b.report_failure, -1);
  EXPECT_EQ(b.signal_groups, 0);
  EXPECT_EQ(r.state.root_cause, 1);
  EXPECT_EQ(r.state.running, 1);
}

TEST(Supervisor, TheGraceRunsOutIntoTheNextStep) {
  Sequence r(2);
  r.stop.steps = {{SIGINT, milliseconds(10)}, {SIGTERM, milliseconds(20)}, {SIGKILL, milliseconds(0)}};
  r.Feed(SupervisorEvent::CoordinatorStop());
  EXPECT_EQ(r.actions.back().signal_groups, SIGINT);
  EXPECT_EQ(r.state.end, GroupEnd::kCoordinatorStop);
  const SupervisorActions a = r.Feed(SupervisorEvent::GraceOver());
  EXPECT_EQ(a.signal_groups, SIGTERM);
  ASSERT_TRUE(a.arm_grace.has_value());
  EXPECT_EQ(*a.arm_grace, milliseconds(20));
  EXPECT_EQ(a.warning, "workers still running 10 ms after SIGINT: sending SIGTERM");
  const SupervisorActions b = r.Feed(SupervisorEvent::GraceOver());
  EXPECT_EQ(b.signal_groups, SIGKILL);
  EXPECT_FALSE(b.arm_grace.has_value());  // nothing comes after SIGKILL
}

TEST(Supervisor, ASignalIsForwardedAsItCameAndASecondOneKills) {
  Sequence r(2);
  const SupervisorActions a = r.Feed(SupervisorEvent::Signal(SIGHUP));
  EXPECT_EQ(a.signal_groups, SIGHUP);
  EXPECT_EQ(r.state.end, GroupEnd::kInterrupted);
  EXPECT_EQ(r.state.signal, SIGHUP);
  const SupervisorActions b = r.Feed(SupervisorEvent::Signal(SIGTERM));
  EXPECT_EQ(b.signal_groups, SIGKILL);
  EXPECT_EQ(r.state.signal, SIGHUP);  // launch exits as the first signal said
}

TEST(Supervisor, ASigtermDuringAFailureStopWaitsButCtrlCKills) {
  Sequence r(2);
  r.Feed(SupervisorEvent::Exited(0, true));
  const SupervisorActions a = r.Feed(SupervisorEvent::Signal(SIGTERM));
  EXPECT_EQ(a.signal_groups, 0);
  EXPECT_EQ(r.state.end, GroupEnd::kInterrupted);
  Sequence c(2);
  c.Feed(SupervisorEvent::Exited(0, true));
  EXPECT_EQ(c.Feed(SupervisorEvent::Signal(SIGINT)).signal_groups, SIGKILL);
}

TEST(Supervisor, LeftoversAreStoppedAndTheGroupStillSucceeds) {
  Sequence r(1);
  r.Feed(SupervisorEvent::Exited(0, false));
  EXPECT_EQ(r.state.phase, Phase::kRunning);
  const SupervisorActions a = r.Feed(SupervisorEvent::GroupsChecked(false));
  EXPECT_EQ(a.signal_groups, SIGTERM);
  EXPECT_EQ(r.state.phase, Phase::kStopping);
  EXPECT_EQ(r.Feed(SupervisorEvent::GroupsChecked(false)).signal_groups, 0);  // no second SIGTERM
  r.Feed(SupervisorEvent::GroupsChecked(true));
  EXPECT_EQ(r.state.phase, Phase::kDone);
  EXPECT_EQ(r.state.end, GroupEnd::kSucceeded);
}

TEST(Supervisor, AHungWorkerIsCapturedThenStoppedAndReportedAsTheStacksName) {
  Sequence r(2);
  const SupervisorActions a = r.Feed(SupervisorEvent::Hung(0));
  EXPECT_EQ(r.state.phase, Phase::kCapturing);
  EXPECT_TRUE(a.capture_stacks);
  EXPECT_EQ(a.signal_groups, 0);  // nothing is stopped before the stacks are taken
  EXPECT_EQ(a.report_failure, -1);
  // The stacks show rank 1 outside the collective rank 0 waits in.
  const SupervisorActions b = r.Feed(SupervisorEvent::CapturesDone(1));
  EXPECT_EQ(r.state.phase, Phase::kStopping);
  EXPECT_EQ(r.state.end, GroupEnd::kFailed);
  EXPECT_EQ(r.state.root_cause, 1);
  EXPECT_EQ(r.state.hung, 1);
  EXPECT_EQ(b.signal_groups, SIGTERM);
  EXPECT_EQ(b.report_failure, 1);
}

TEST(Supervisor, CapturesThatTakeTooLongDoNotHoldTheStop) {
  Sequence r(2);
  r.stop.capture_grace = milliseconds(7);
  EXPECT_EQ(*r.Feed(SupervisorEvent::Hung(1)).arm_grace, milliseconds(7));
  const SupervisorActions a = r.Feed(SupervisorEvent::GraceOver());
  EXPECT_EQ(a.signal_groups, SIGTERM);
  EXPECT_EQ(a.report_failure, 1);
  EXPECT_EQ(r.state.phase, Phase::kStopping);
}

TEST(Supervisor, ASignalDuringACaptureStopsAtOnceAndAFailureDoesNotTakeTheBlame) {
  Sequence r(3);
  r.Feed(SupervisorEvent::Hung(2));
  EXPECT_EQ(r.Feed(SupervisorEvent::Exited(0, true)).signal_groups, 0);
  EXPECT_EQ(r.state.root_cause, 2);
  // The coordinator's stop (another node found the hang too) waits for the stacks.
  EXPECT_EQ(r.Feed(SupervisorEvent::CoordinatorStop(true)).signal_groups, 0);
  EXPECT_EQ(r.state.phase, Phase::kCapturing);
  const SupervisorActions a = r.Feed(SupervisorEvent::Signal(SIGINT));
  EXPECT_EQ(a.signal_groups, SIGINT);
  EXPECT_EQ(r.state.end, GroupEnd::kInterrupted);
  // A hang while stopping for something else is not looked into.
  Sequence q(2);
  q.Feed(SupervisorEvent::Exited(0, true));
  EXPECT_FALSE(q.Feed(SupervisorEvent::Hung(1)).capture_stacks);
}

TEST(Supervisor, AStopForAHangElsewhereCapturesFirstAndBlamesNoLocalWorker) {
  Sequence r(2);
  const SupervisorActions a = r.Feed(SupervisorEvent::CoordinatorStop(/*capture=*/true));
  EXPECT_EQ(r.state.phase, Phase::kCapturing);
  EXPECT_TRUE(a.capture_stacks);
  EXPECT_EQ(a.signal_groups, 0);
  const SupervisorActions b = r.Feed(SupervisorEvent::CapturesDone());
  EXPECT_EQ(b.signal_groups, SIGTERM);
  EXPECT_EQ(b.report_failure, -1);
  EXPECT_EQ(r.state.end, GroupEnd::kCoordinatorStop);
  EXPECT_EQ(r.state.root_cause, -1);
}

TEST(Supervisor, EveryEventInEveryPhaseIsAStep) {
  // The transition function is total: nothing an event can do in any phase is left undefined,
  // and after the end nothing acts.
  const std::vector<SupervisorEvent> events = {
      SupervisorEvent::Exited(0, true),       SupervisorEvent::Exited(0, false), SupervisorEvent::Failing(0),
      SupervisorEvent::Signal(SIGTERM),       SupervisorEvent::Signal(SIGINT),   SupervisorEvent::CoordinatorStop(),
      SupervisorEvent::CoordinatorStop(true), SupervisorEvent::GraceOver(),      SupervisorEvent::GroupsChecked(true),
      SupervisorEvent::GroupsChecked(false),  SupervisorEvent::Hung(0),          SupervisorEvent::CapturesDone(0)};
  for (Phase phase : {Phase::kRunning, Phase::kCapturing, Phase::kStopping, Phase::kDone}) {
    for (const SupervisorEvent& e : events) {
      SupervisorState s;
      s.phase = phase;
      s.running = 0;
      SupervisorStep step = Supervise(StopEscalation::TermThenKill(milliseconds(1)), s, e);
      EXPECT_GE(step.state.running, 0);
      if (phase == Phase::kDone) {
        EXPECT_EQ(step.state.phase, Phase::kDone);
        EXPECT_EQ(step.actions.signal_groups, 0);
        EXPECT_FALSE(step.actions.arm_grace.has_value());
      }
    }
  }
}

// Each event's handler in the phases where it acts, one step from a group of two workers (one in
// the capturing phase: worker 1 hung; in the stopping phase: a failure's stop, its first step taken).
TEST(Supervisor, EachEventActsAsItsPhaseSays) {
  struct Case {
    Phase from;
    GroupEnd from_end;
    int running;
    SupervisorEvent event;
    Phase to;
    GroupEnd to_end;
    int signal;    // signal_groups
    int grace_ms;  // arm_grace; -1: not armed
    int report;    // report_failure
    bool capture;
  };
  using E = SupervisorEvent;
  constexpr GroupEnd kOk = GroupEnd::kSucceeded, kFailed = GroupEnd::kFailed, kInt = GroupEnd::kInterrupted,
                     kCoord = GroupEnd::kCoordinatorStop;
  const std::vector<Case> cases = {
      {Phase::kRunning, kOk, 2, E::Exited(1, true), Phase::kStopping, kFailed, SIGTERM, 5000, 1, false},
      {Phase::kRunning, kOk, 2, E::Exited(1, false), Phase::kRunning, kOk, 0, -1, -1, false},
      {Phase::kRunning, kOk, 2, E::Failing(1), Phase::kStopping, kFailed, SIGTERM, 5000, 1, false},
      {Phase::kStopping, kFailed, 2, E::Exited(0, true), Phase::kStopping, kFailed, 0, -1, -1, false},
      {Phase::kRunning, kOk, 2, E::Signal(SIGHUP), Phase::kStopping, kInt, SIGHUP, 5000, -1, false},
      {Phase::kCapturing, kFailed, 2, E::Signal(SIGTERM), Phase::kStopping, kInt, SIGTERM, 5000, -1, false},
      {Phase::kStopping, kFailed, 2, E::Signal(SIGTERM), Phase::kStopping, kInt, 0, -1, -1, false},
      {Phase::kStopping, kFailed, 2, E::Signal(SIGINT), Phase::kStopping, kInt, SIGKILL, -1, -1, false},
      {Phase::kStopping, kInt, 2, E::Signal(SIGTERM), Phase::kStopping, kInt, SIGKILL, -1, -1, false},
      {Phase::kRunning, kOk, 2, E::CoordinatorStop(), Phase::kStopping, kCoord, SIGTERM, 5000, -1, false},
      {Phase::kRunning, kOk, 2, E::CoordinatorStop(true), Phase::kCapturing, kCoord, 0, 7000, -1, true},
      {Phase::kCapturing, kFailed, 2, E::CoordinatorStop(), Phase::kCapturing, kFailed, 0, -1, -1, false},
      {Phase::kRunning, kOk, 2, E::Hung(1), Phase::kCapturing, kFailed, 0, 7000, -1, true},
      {Phase::kStopping, kFailed, 2, E::Hung(1), Phase::kStopping, kFailed, 0, -1, -1, false},
      {Phase::kCapturing, kFailed, 2, E::CapturesDone(0), Phase::kStopping, kFailed, SIGTERM, 5000, 0, false},
      {Phase::kRunning, kOk, 2, E::CapturesDone(0), Phase::kRunning, kOk, 0, -1, -1, false},
      {Phase::kCapturing, kFailed, 2, E::GraceOver(), Phase::kStopping, kFailed, SIGTERM, 5000, 1, false},
      {Phase::kStopping, kFailed, 2, E::GraceOver(), Phase::kStopping, kFailed, SIGKILL, -1, -1, false},
      {Phase::kRunning, kOk, 2, E::GraceOver(), Phase::kRunning, kOk, 0, -1, -1, false},
      {Phase::kRunning, kOk, 0, E::GroupsChecked(false), Phase::kStopping, kOk, SIGTERM, 5000, -1, false},
      {Phase::kRunning, kOk, 0, E::GroupsChecked(true), Phase::kDone, kOk, 0, -1, -1, false},
      {Phase::kStopping, kFailed, 0, E::GroupsChecked(false), Phase::kStopping, kFailed, 0, -1, -1, false},
      {Phase::kRunning, kOk, 2, E::GroupsChecked(true), Phase::kRunning, kOk, 0, -1, -1, false},
  };
  StopEscalation stop = StopEscalation::TermThenKill(milliseconds(5000));
  stop.capture_grace = milliseconds(7000);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(::testing::Message() << "case " << i << " from " << SupervisorPhaseName(c.from));
    SupervisorState s;
    s.phase = c.from;
    s.end = c.from_end;
    s.running = c.running;
    if (c.from == Phase::kCapturing) s.hung = s.root_cause = 1;
    if (c.from == Phase::kStopping) s.next_step = 1;
    const SupervisorStep step = Supervise(stop, s, c.event);
    EXPECT_EQ(step.state.phase, c.to);
    EXPECT_EQ(step.state.end, c.to_end);
    EXPECT_EQ(step.actions.signal_groups, c.signal);
    EXPECT_EQ(step.actions.arm_grace.has_value() ? static_cast<int>(step.actions.arm_grace->count()) : -1, c.grace_ms);
    EXPECT_EQ(step.actions.report_failure, c.report);
    EXPECT_EQ(step.actions.capture_stacks, c.capture);
  }
}

// ---- Stack files ----

TEST(StackFrames, GdbsMainThreadWithSourceLocations) {
  const std::string gdb =
      "[New LWP 12]\n"
      "Thread 2 (Thread 0x7f (LWP 12) \"gloo\"):\n"
      "#0  0x00007f in epoll_wait () from /lib/x86_64-linux-gnu/libc.so.6\n"
      "\n"
      "Thread 1 (Thread 0x7e (LWP 11) \"train_mlp\"):\n"
      "#0  0x00007f in __GI___clock_nanosleep (clock_id=0) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:78\n"
      "#1  0x00007f in __GI___nanosleep (req=0x7ffd) at nanosleep.c:25\n"
      "#2  0x000055 in std::this_thread::sleep_for<long, std::ratio<3600l, 1l> > (__rtime=...) at "
      "/usr/include/c++/12/bits/this_thread_sleep.h:80\n"
      "#3  (anonymous namespace)::HangForever (rank=1, step=5) at /src/examples/train_mlp.cc:42\n"
      "#4  0x000055 in main (argc=9) at /src/examples/train_mlp.cc:175\n"
      "[Inferior 1 (process 11) detached]\n";
  const std::vector<std::string> frames = MainThreadFrames(gdb);
  ASSERT_EQ(frames.size(), 5u);
  EXPECT_EQ(frames[0], "__GI___clock_nanosleep (clock_nanosleep.c:78)");
  EXPECT_EQ(frames[3], "(anonymous namespace)::HangForever (train_mlp.cc:42)");
  EXPECT_FALSE(WaitsInCollective(frames));
  EXPECT_EQ(TopFrames(frames, 3), (std::vector<std::string>{"__GI___clock_nanosleep (clock_nanosleep.c:78)",
                                                            "(anonymous namespace)::HangForever (train_mlp.cc:42)",
                                                            "main (train_mlp.cc:175)"}));
}

TEST(StackFrames, FaulthandlersCurrentThreadAndACollectiveWait) {
  const std::string py =
      "Thread 0x00007f01 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "\n"
      "Current thread 0x00007f00 (most recent call first):\n"
      "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1536 in all_reduce\n"
      "  File \"/work/tests/python/hang.py\", line 30 in main\n"
      "  File \"/work/tests/python/hang.py\", line 40 in <module>\n";
  const std::vector<std::string> frames = MainThreadFrames(py);
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0], "all_reduce (distributed_c10d.py:1536)");
  EXPECT_EQ(frames[1], "main (hang.py:30)");
  EXPECT_TRUE(WaitsInCollective(frames));
  // worker_sdk's DDP waits for its bucket allreduces in Finish; a name that only contains the
  // letters is not a collective.
  EXPECT_TRUE(WaitsInCollective({"__futex_abstimed_wait_common64 (futex-internal.c:57)",
                                 "launch_sdk::DistributedDataParallel::Finish (ddp.cc:157)"}));
  EXPECT_FALSE(WaitsInCollective({"Mesh::addPoint (geom.cc:3)", "time.sleep (train.py:9)"}));
  EXPECT_TRUE(MainThreadFrames("garbage\n#0 nothing\n").empty());
}

// ---- WorkerGroup through the fake launcher ----

// Simulated time (the group's loop moves it to its next timer whenever nothing is ready), with a
// hook run at each reading.
class HookClock : public SimulatedClock {
 public:
  TimePoint Now() const override {
    const TimePoint now = SimulatedClock::Now();
    if (hook) hook(now);
    return now;
  }
  std::function<void(TimePoint)> hook;
};

class FakeGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BlockLauncherSignals();
    auto s = SignalFd::Create();
    ASSERT_TRUE(s.ok());
    signals_.emplace(std::move(*s));
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    console_read_.Reset(p[0]);
    console_write_.Reset(p[1]);
    console_ = std::make_unique<ConsoleStream>(console_write_.get());
  }
  std::vector<WorkerLaunch> Launches(int n) {
    std::vector<WorkerLaunch> out;
    for (int i = 0; i < n; ++i) {
      WorkerLaunch w;
      w.local_rank = i;
      w.rank = i;
      w.argv = {"/fake/worker"};
      out.push_back(w);
    }
    return out;
  }
  WorkerGroup::Options Opts() {
    WorkerGroup::Options o;
    o.stop = StopEscalation::TermThenKill(std::chrono::hours(1));  // on simulated time: SIGKILL at 1 h
    o.console_out = console_.get();
    o.console_err = console_.get();
    o.stdin_fd = -1;
    return o;
  }
  absl::StatusOr<GroupOutcome> RunGroup(const WorkerGroup::Options& o, int n) {
    WorkerGroup group(o, &launcher_, nullptr, &*signals_, &clock_);
    return group.Run(Launches(n));
  }
  std::string ConsoleText() {
    console_->Drain();
    console_write_.Reset();
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(console_read_.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }

  // A group of 3 whose workers report two steps each as they start, but for `silent`; on_stepping
  // stops it (from outside) and counts its calls; a silent worker's hang timeout ends it otherwise.
  struct SteppingRun {
    absl::StatusOr<GroupOutcome> outcome;
    int calls = 0;
  };
  SteppingRun RunStepping(int silent, std::chrono::milliseconds stepping_wait) {
    WorkerGroup::Options o = Opts();
    launcher_.script = [silent](int n, const SpawnOptions& so) {
      FakeProcessLauncher::Script s;
      if (so.argv[0] == "/fake/gdb") {
        s.exit_at_start = 0;
        return s;
      }
      for (int step = 1; step <= 2 && n != silent; ++step) {
        launch_sdk::ProgressRecord rec;
        rec.rank = n;
        rec.step = step;
        rec.step_seconds = 0.001;
        EXPECT_EQ(::send(so.extra_fd, &rec, sizeof rec, 0), static_cast<ssize_t>(sizeof rec));
      }
      return s;  // runs until stopped
    };
    UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    o.stop_fd = stop.get();
    o.stepping_wait = stepping_wait;
    o.hang.timeout = milliseconds(40);
    o.hang.debugger = "/fake/gdb";
    SteppingRun r;
    o.on_stepping = [&] {
      ++r.calls;
      const uint64_t one = 1;
      EXPECT_EQ(::write(stop.get(), &one, sizeof one), 8);
    };
    r.outcome = RunGroup(o, 3);
    return r;
  }

  std::optional<SignalFd> signals_;
  FakeProcessLauncher launcher_;
  HookClock clock_;
  UniqueFd console_read_, console_write_;
  std::unique_ptr<ConsoleStream> console_;
};

TEST_F(FakeGroupTest, AllExitZeroSucceedsWithNoSignalSent) {
  launcher_.script = [](int, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    s.exit_at_start = 0;
    return s;
  };
  auto out = RunGroup(Opts(), 3);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, GroupEnd::kSucceeded);
  EXPECT_EQ(out->workers.size(), 3u);
  EXPECT_TRUE(launcher_.sent().empty());
}

// Warm workers: each go may wait for its standby to get ready (here 5 s for rank 0's). A worker's
// run time counted from its go, so rank 0's held that wait and rank 1's did not; it counts from
// the fork for both now.
class WaitingWarmWorkers : public WarmWorkers {
 public:
  WaitingWarmWorkers(FakeProcessLauncher* launcher, SimulatedClock* clock) : launcher_(launcher), clock_(clock) {}
  bool Send(const WorkerLaunch& w, const WorkerFds& fds) override {
    if (w.local_rank == 0) clock_->Advance(std::chrono::seconds(5));  // its standby gets ready
    SpawnOptions so;
    so.argv = w.argv;
    so.stdout_fd = ::dup(fds.out);
    so.stderr_fd = ::dup(fds.err);
    so.extra_fd = ::dup(fds.progress);
    sent_[w.local_rank] = so;
    return true;
  }
  std::optional<pid_t> Take(const WorkerLaunch& w) override {
    SpawnOptions so = sent_.at(w.local_rank);
    auto pid = launcher_->Spawn(so);
    for (int fd : {so.stdout_fd, so.stderr_fd, so.extra_fd}) ::close(fd);
    if (!pid.ok()) return std::nullopt;
    return *pid;
  }

 private:
  FakeProcessLauncher* launcher_;
  SimulatedClock* clock_;
  std::map<int, SpawnOptions> sent_;
};

TEST_F(FakeGroupTest, AWarmWorkersRunTimeCountsFromItsForkNotItsStandbysWait) {
  launcher_.script = [this](int, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    clock_.Advance(std::chrono::seconds(1));  // each runs 1 s (its exit is seen after this)
    s.exit_at_start = 3;
    return s;
  };
  WaitingWarmWorkers warm(&launcher_, &clock_);
  WorkerGroup::Options o = Opts();
  o.warm = &warm;
  auto out = RunGroup(o, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->workers.size(), 2u);
  EXPECT_LT(out->workers[0].run_seconds, 4.0);  // it was 6 s: the standby's 5 s wait counted
  EXPECT_LT(out->workers[1].run_seconds, 4.0);
}

TEST_F(FakeGroupTest, AFailureStopsTheOthersAndNamesTheRootCause) {
  launcher_.script = [](int n, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    if (n == 1) s.exit_at_start = 3;
    return s;
  };
  std::vector<int> reported;
  WorkerGroup::Options o = Opts();
  o.on_failure = [&](const WorkerResult& w) { reported.push_back(w.rank); };
  auto out = RunGroup(o, 3);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, GroupEnd::kFailed);
  EXPECT_EQ(out->root_cause, 1);
  EXPECT_EQ(out->workers[1].exit_code, 3);
  EXPECT_EQ(out->workers[0].signal, SIGTERM);
  EXPECT_EQ(out->workers[2].signal, SIGTERM);
  EXPECT_EQ(reported, std::vector<int>{1});
  EXPECT_EQ(launcher_.SignalsTo(out->workers[0].pid), std::vector<int>{SIGTERM});
}

TEST_F(FakeGroupTest, AWorkerThatIgnoresSigtermIsKilledWhenTheGraceRunsOut) {
  launcher_.script = [](int n, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    if (n == 0) s.survives = {SIGTERM};
    if (n == 1) s.exit_at_start = 1;
    return s;
  };
  WorkerGroup::Options o = Opts();
  o.stop = StopEscalation::TermThenKill(std::chrono::seconds(30));
  auto out = RunGroup(o, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->workers[0].signal, SIGKILL);
  EXPECT_EQ(launcher_.SignalsTo(out->workers[0].pid), (std::vector<int>{SIGTERM, SIGKILL}));
  // On simulated time the grace ran out exactly 30 s after the failure.
  EXPECT_EQ(out->workers[0].ended - out->workers[1].ended, std::chrono::seconds(30));
}

TEST_F(FakeGroupTest, ASecondSignalKillsWithoutWaitingForTheGrace) {
  launcher_.script = [](int, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    s.survives = {SIGINT, SIGTERM};
    return s;
  };
  ::raise(SIGINT);  // blocked: both wait on the signal fd
  ::raise(SIGTERM);
  auto out = RunGroup(Opts(), 2);  // the grace is an hour
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, GroupEnd::kInterrupted);
  EXPECT_EQ(out->signal, SIGINT);
  EXPECT_EQ(launcher_.SignalsTo(out->workers[0].pid), (std::vector<int>{SIGINT, SIGKILL}));
}

TEST_F(FakeGroupTest, TheCoordinatorsStopEndsTheGroup) {
  UniqueFd stop(::eventfd(1, EFD_CLOEXEC));
  WorkerGroup::Options o = Opts();
  o.stop_fd = stop.get();
  auto out = RunGroup(o, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, GroupEnd::kCoordinatorStop);
  EXPECT_EQ(out->workers[1].signal, SIGTERM);
}

TEST_F(FakeGroupTest, ProcessesLeftInAGroupAreStoppedBeforeTheGroupEnds) {
  launcher_.script = [](int, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    s.exit_at_start = 0;
    s.leaves_child = true;
    return s;
  };
  auto out = RunGroup(Opts(), 1);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, GroupEnd::kSucceeded);
  EXPECT_EQ(launcher_.SignalsTo(out->workers[0].pid), std::vector<int>{SIGTERM});
  EXPECT_FALSE(launcher_.GroupAlive(out->workers[0].pid));
}

TEST_F(FakeGroupTest, AWorkerThatCannotStartTakesDownTheOnesAlreadyStarted) {
  launcher_.script = [](int n, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    if (n == 2) s.spawn_error = absl::NotFoundError("cannot start '/fake/worker'");
    return s;
  };
  auto out = RunGroup(Opts(), 3);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(launcher_.killed_and_reaped(), (std::vector<pid_t>{1000, 1001}));
  EXPECT_FALSE(launcher_.Running(1000));
  EXPECT_FALSE(launcher_.Running(1001));
}

TEST_F(FakeGroupTest, OutputIsShownWithRankPrefixesAndStderrKeptForTheSummary) {
  launcher_.script = [](int n, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    s.stdout_text = "step 1\n";
    if (n == 1) {
      s.stderr_text = "Traceback\nValueError: bad\n";
      s.exit_at_start = 1;
    } else {
      s.exit_at_start = 0;
    }
    return s;
  };
  auto out = RunGroup(Opts(), 2);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->kind, GroupEnd::kFailed);
  EXPECT_EQ(out->workers[1].stderr_tail, (std::deque<std::string>{"Traceback", "ValueError: bad"}));
  const std::string text = ConsoleText();
  EXPECT_NE(text.find("[0]:step 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[1]:ValueError: bad\n"), std::string::npos) << text;
}

// Two workers report step 5 and go silent; the fake debugger's stacks show rank 0 waiting in an
// allreduce and rank 1 outside any collective: rank 1 is named hung, its stack top is kept, and
// the group stops only after the captures.
TEST_F(FakeGroupTest, ASilentWorkerIsHungAndTheStacksNameTheOneOutsideTheCollective) {
  TempDir dir;
  launcher_.script = [](int n, const SpawnOptions& so) {
    FakeProcessLauncher::Script s;
    if (so.argv[0] != "/fake/gdb") {
      launch_sdk::ProgressRecord rec;
      rec.rank = n;
      rec.step = 5;
      rec.step_seconds = 0.001;
      EXPECT_EQ(::send(so.extra_fd, &rec, sizeof rec, 0), static_cast<ssize_t>(sizeof rec));
      return s;  // then runs silently until stopped
    }
    const bool rank0 = so.argv[4] == "1000";
    s.stdout_text =
        rank0 ? "Thread 1 (LWP 1):\n#0  0x1 in gloo::transport::tcp::UnboundBuffer::waitRecv () from /lib/libgloo.so\n"
              : "Thread 1 (LWP 2):\n#0  0x1 in nanosleep () from /lib/libc.so.6\n"
                "#1  HangForever (rank=1) at /src/train_mlp.cc:42\n";
    s.exit_at_start = 0;
    return s;
  };
  std::vector<WorkerLaunch> l = Launches(2);
  for (int i = 0; i < 2; ++i) l[i].native_stack_file = dir / ("stacks" + std::to_string(i));
  WorkerGroup::Options o = Opts();
  o.hang.timeout = milliseconds(20);
  o.hang.debugger = "/fake/gdb";
  std::vector<int> reported;
  o.on_failure = [&](const WorkerResult& w) { reported.push_back(w.rank); };
  WorkerGroup group(o, &launcher_, nullptr, &*signals_, &clock_);
  auto out = group.Run(l);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, GroupEnd::kFailed);
  EXPECT_EQ(out->root_cause, 1);
  EXPECT_TRUE(out->workers[1].hung);
  EXPECT_FALSE(out->workers[0].hung);
  EXPECT_EQ(out->workers[1].StatusText(), "hung");
  EXPECT_EQ(out->workers[1].AsExitCode(), kHungExitCode);
  EXPECT_EQ(out->workers[1].stack_top,
            (std::vector<std::string>{"nanosleep (libc.so.6)", "HangForever (train_mlp.cc:42)"}));
  EXPECT_EQ(reported, std::vector<int>{1});
  // Both were debugged before anything was signalled.
  ASSERT_EQ(launcher_.spawned().size(), 4u);
  EXPECT_EQ(launcher_.SignalsTo(1000), std::vector<int>{SIGTERM});
  const std::string summary = FailureSummary(*out, "failed");
  EXPECT_NE(summary.find("hung"), std::string::npos) << summary;
  EXPECT_NE(summary.find("[1] stack: HangForever (train_mlp.cc:42)"), std::string::npos) << summary;
}

TEST_F(FakeGroupTest, AWorkerThatNeverReportedIsNeverHung) {
  launcher_.script = [](int n, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    if (n == 1) s.exit_at_start = 0;
    return s;
  };
  UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  WorkerGroup::Options o = Opts();
  o.hang.timeout = milliseconds(1);
  o.hang.debugger = "/fake/gdb";
  o.stop_fd = stop.get();
  // Stopped from outside once an hour of hang checks (every 10 ms) has passed without a finding.
  bool stopped = false;
  clock_.hook = [&](Clock::TimePoint now) {
    if (!stopped && now >= Clock::TimePoint(std::chrono::hours(1))) {
      stopped = true;
      const uint64_t one = 1;
      EXPECT_EQ(::write(stop.get(), &one, sizeof one), 8);
    }
  };
  auto out = RunGroup(o, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->kind, GroupEnd::kCoordinatorStop);
  EXPECT_FALSE(out->workers[0].hung);
  EXPECT_EQ(launcher_.spawned().size(), 2u);  // no debugger
}

// on_stepping: once every worker has reported a step...
TEST_F(FakeGroupTest, OnSteppingComesOnceEveryWorkerHasReportedAStep) {
  SteppingRun r = RunStepping(/*silent=*/-1, std::chrono::hours(1));
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status();
  EXPECT_EQ(r.outcome->kind, GroupEnd::kCoordinatorStop);
  EXPECT_EQ(r.calls, 1);
}

// ... and not while one has not, even past stepping_wait (the others report steps): that group
// ends when the others' hang timeout runs out.
TEST_F(FakeGroupTest, OnSteppingDoesNotComeWhileAWorkerHasReportedNothing) {
  SteppingRun r = RunStepping(/*silent=*/2, milliseconds(5));
  ASSERT_TRUE(r.outcome.ok()) << r.outcome.status();
  EXPECT_EQ(r.outcome->kind, GroupEnd::kFailed);
  EXPECT_EQ(r.calls, 0);
}

// Workers that report nothing: on_stepping once stepping_wait has passed; without a report and
// before it, never.
TEST_F(FakeGroupTest, OnSteppingComesAfterItsWaitForWorkersThatReportNothing) {
  launcher_.script = [](int, const SpawnOptions&) { return FakeProcessLauncher::Script(); };
  UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  WorkerGroup::Options o = Opts();
  o.stop_fd = stop.get();
  o.stepping_wait = milliseconds(30);
  int calls = 0;
  const Clock::TimePoint started = clock_.Now();
  Clock::TimePoint called;
  o.on_stepping = [&] {
    ++calls;
    called = clock_.Now();
    const uint64_t one = 1;
    EXPECT_EQ(::write(stop.get(), &one, sizeof one), 8);
  };
  auto out = RunGroup(o, 2);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(called - started, milliseconds(30));  // simulated time: exactly when it was due
}

TEST_F(FakeGroupTest, EveryWorkerGetsTheProgressSocketAndOnlyRankZeroReadsStdin) {
  launcher_.script = [](int, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    s.exit_at_start = 0;
    return s;
  };
  WorkerGroup::Options o = Opts();
  std::vector<WorkerLaunch> l = Launches(2);
  l[0].reads_stdin = true;
  UniqueFd in(::eventfd(0, EFD_CLOEXEC));  // not a terminal: rank 0 inherits it
  o.stdin_fd = in.get();
  WorkerGroup group(o, &launcher_, nullptr, &*signals_, &clock_);
  ASSERT_TRUE(group.Run(l).ok());
  ASSERT_EQ(launcher_.spawned().size(), 2u);
  EXPECT_EQ(launcher_.spawned()[0].stdin_fd, in.get());
  EXPECT_NE(launcher_.spawned()[1].stdin_fd, in.get());
  for (const SpawnOptions& so : launcher_.spawned()) EXPECT_EQ(so.extra_fd_target, 3);
}

}  // namespace
}  // namespace launch
