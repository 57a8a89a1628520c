// torchrun's file timer: the pure table (requests in, expiries at a given time out) as tables of
// lines and times, and the server on a real FIFO with a fake wall clock and a real child.
#include "agent/file_timer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::TempDir;
using testing::WaitUntil;

// One request as torch's FileTimerClient writes it (json.dumps, then a newline).
std::string Line(pid_t pid, const std::string& scope, double expiration, int signal) {
  return absl::StrFormat(
      "{\"version\": 1, \"pid\": %d, \"scope_id\": \"%s\", \"expiration_time\": %.6f, "
      "\"signal\": %d}\n",
      pid, scope, expiration, signal);
}

// What expired, as "pid:scope:signal".
std::vector<std::string> Expired(TimerTable* t, double now) {
  std::vector<std::string> out;
  for (const TimerExpiry& e : t->TakeExpired(now))
    out.push_back(absl::StrCat(e.pid, ":", e.scope_id, ":", e.signal));
  return out;
}

TEST(TimerTable, AnAcquiredTimerExpiresAtItsTimeWithItsSignalAndRank) {
  TimerTable t;
  t.AddWorker(100, 3);
  EXPECT_THAT(t.Feed(Line(100, "train.py#12", 10.0, SIGKILL)), IsEmpty());
  EXPECT_EQ(t.NextExpiration(), 10.0);
  EXPECT_THAT(Expired(&t, 9.999), IsEmpty());
  std::vector<TimerExpiry> e = t.TakeExpired(10.0);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].pid, 100);
  EXPECT_EQ(e[0].rank, 3);
  EXPECT_EQ(e[0].scope_id, "train.py#12");
  EXPECT_EQ(e[0].signal, SIGKILL);
  EXPECT_EQ(t.size(), 0u);  // handled once
  EXPECT_THAT(Expired(&t, 1e9), IsEmpty());
  EXPECT_EQ(t.counts().set, 1);
  EXPECT_EQ(t.counts().expired, 1);
}

TEST(TimerTable, AReleasedTimerNeverExpiresAndAReleaseOfNothingIsHarmless) {
  TimerTable t;
  t.AddWorker(100, 0);
  t.Feed(Line(100, "a", 10.0, SIGKILL) + Line(100, "a", -1, 0) + Line(100, "never-held", -1, 0));
  EXPECT_THAT(Expired(&t, 1e9), IsEmpty());
  EXPECT_EQ(t.counts().released, 1);
  EXPECT_EQ(t.counts().ignored(), 0);
}

TEST(TimerTable, AcquiringAHeldScopeAgainMovesItsDeadline) {
  TimerTable t;
  t.AddWorker(100, 0);
  t.Feed(Line(100, "a", 10.0, SIGKILL));
  t.Feed(Line(100, "a", 20.0, SIGTERM));
  EXPECT_EQ(t.size(), 1u);
  EXPECT_THAT(Expired(&t, 15.0), IsEmpty());
  EXPECT_THAT(Expired(&t, 20.0), ElementsAre("100:a:15"));
}

TEST(TimerTable, ScopesAreHeldPerPid) {
  TimerTable t;
  t.AddWorker(100, 0);
  t.AddWorker(200, 1);
  t.Feed(Line(100, "a", 10.0, SIGKILL) + Line(200, "a", 30.0, SIGKILL) + Line(200, "a", -1, 0));
  EXPECT_THAT(Expired(&t, 40.0), ElementsAre("100:a:9"));
}

TEST(TimerTable, ExpiriesComeEarliestFirstAndEndEveryTimerOfTheirWorker) {
  TimerTable t;
  t.AddWorker(100, 0);
  t.AddWorker(200, 1);
  t.AddWorker(300, 2);
  t.Feed(Line(100, "late", 7.0, SIGKILL) + Line(100, "other", 50.0, SIGKILL) +
         Line(200, "early", 5.0, SIGTERM) + Line(300, "later", 60.0, SIGKILL));
  EXPECT_THAT(Expired(&t, 8.0), ElementsAre("200:early:15", "100:late:9"));
  // pid 100's unexpired timer went with it (as torch clears a reaped worker's timers); 300's stays.
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.NextExpiration(), 60.0);
}

TEST(TimerTable, AWorkerGetsTheSignalOfItsEarliestExpiredTimerThatNamesOne) {
  TimerTable t;
  t.AddWorker(100, 0);
  t.Feed(Line(100, "no-signal", 1.0, 0) + Line(100, "term", 2.0, SIGTERM) +
         Line(100, "kill", 3.0, SIGKILL) + Line(100, "not-yet", 9.0, SIGKILL));
  EXPECT_THAT(Expired(&t, 5.0), ElementsAre("100:term:15"));
  // With none that names a signal: the earliest, signal 0 (torch logs it and leaves the worker).
  t.Feed(Line(100, "b", 2.0, -1) + Line(100, "a", 1.0, 0));
  EXPECT_THAT(Expired(&t, 5.0), ElementsAre("100:a:0"));
}

// A worker forked from a warm standby may write before the agent has its pid: a request from a
// pid not known yet is held, and taken, in order, once the pid is added.
TEST(TimerTable, ARequestFromAPidNotKnownYetIsTakenOnceThePidIsAdded) {
  TimerTable t;
  EXPECT_THAT(t.Feed(Line(100, "a", 5.0, SIGKILL) + Line(100, "b", 6.0, SIGTERM) + Line(100, "b", -1, 0)),
              IsEmpty());
  EXPECT_EQ(t.counts().held, 3);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_THAT(Expired(&t, 1e9), IsEmpty());  // no timer before its pid is a worker's
  EXPECT_THAT(t.AddWorker(100, 1), IsEmpty());
  EXPECT_EQ(t.counts().held, 0);
  EXPECT_EQ(t.size(), 1u);  // "b" was released after it was set
  EXPECT_EQ(t.counts().set, 2);
  EXPECT_EQ(t.counts().released, 1);
  EXPECT_EQ(t.counts().unknown_pid, 0);
  const std::vector<TimerExpiry> e = t.TakeExpired(5.0);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].rank, 1);
  EXPECT_EQ(e[0].scope_id, "a");
}

// Requests from pids that never become workers are ignored when the attempt ends, with one
// warning; past kMaxHeldRequests they are ignored at once, with one warning.
TEST(TimerTable, ARequestFromAPidThatIsNoWorkerIsIgnoredWithOneWarning) {
  TimerTable t;
  t.AddWorker(100, 0);
  EXPECT_THAT(t.Feed(Line(999, "a", 1.0, SIGKILL) + Line(998, "b", 1.0, SIGKILL) + Line(999, "c", 1.0, SIGKILL)),
              IsEmpty());
  EXPECT_EQ(t.counts().held, 3);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_THAT(Expired(&t, 1e9), IsEmpty());
  std::vector<std::string> warnings = t.ClearWorkers();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("ignored 3 request(s) from 2 pid(s) that were no worker of the attempt"));
  EXPECT_EQ(t.counts().unknown_pid, 3);
  EXPECT_EQ(t.counts().held, 0);
  EXPECT_THAT(t.AddWorker(999, 0), IsEmpty());  // the next attempt's worker: nothing held for it
  EXPECT_EQ(t.size(), 0u);

  std::string many;
  for (size_t i = 0; i < kMaxHeldRequests + 2; ++i) many += Line(5000, absl::StrCat("s", i), 1.0, SIGKILL);
  warnings = t.Feed(many);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("ignored a request from pid 5000, which is no worker of this attempt"));
  // The one that found no room took the pid's held ones with it; the last one is held again.
  EXPECT_EQ(t.counts().held, 1);
  EXPECT_EQ(t.counts().unknown_pid, 3 + static_cast<int64_t>(kMaxHeldRequests) + 1);
}

// When the held requests are full, a request lost takes its pid's held ones with it: a timer set
// whose release was lost must not kill the worker that left its scope in time.
TEST(TimerTable, ARequestLostToAFullHoldTakesItsPidsHeldOnesWithIt) {
  TimerTable t;
  std::string lines = Line(100, "a", 5.0, SIGKILL);
  for (size_t i = 1; i < kMaxHeldRequests; ++i) lines += Line(5000, absl::StrCat("s", i), 1.0, SIGKILL);
  EXPECT_THAT(t.Feed(lines), IsEmpty());
  EXPECT_EQ(t.counts().held, static_cast<int64_t>(kMaxHeldRequests));
  const std::vector<std::string> warnings = t.Feed(Line(100, "a", -1, 0));  // its release: no room
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("and the 1 held from it"));
  EXPECT_EQ(t.counts().unknown_pid, 2);
  EXPECT_EQ(t.counts().held, static_cast<int64_t>(kMaxHeldRequests) - 1);
  t.AddWorker(100, 0);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_THAT(Expired(&t, 1e9), IsEmpty());
  // The next attempt names its first ignored request again.
  t.ClearWorkers();
  t.AddWorker(200, 0);
  std::string full;
  for (size_t i = 0; i < kMaxHeldRequests + 1; ++i) full += Line(6000, absl::StrCat("s", i), 1.0, SIGKILL);
  EXPECT_EQ(t.Feed(full).size(), 1u);
}

TEST(TimerTable, ClearingTheWorkersEndsTheirTimers) {
  TimerTable t;
  t.AddWorker(100, 0);
  t.Feed(Line(100, "a", 1.0, SIGKILL));
  t.ClearWorkers();
  EXPECT_EQ(t.size(), 0u);
  EXPECT_THAT(Expired(&t, 1e9), IsEmpty());
}

struct BadLine {
  std::string name;
  std::string line;  // without its newline
  std::string warning;
};

TEST(TimerTable, BadRequestsAreCountedAndIgnoredWithOneWarning) {
  const std::string long_scope(kMaxTimerScopeLength + 1, 's');
  const std::vector<BadLine> bad = {
      {"not JSON", "{\"pid\": 100, ", "not a timer request in JSON"},
      {"a list", "[1, 2]", "not a timer request in JSON"},
      {"pid as text", R"({"pid": "x", "scope_id": "a", "expiration_time": 1, "signal": 9})",
       "not a timer request"},
      {"no pid", R"({"scope_id": "a", "expiration_time": 1, "signal": 9})", "without \"pid\""},
      {"no scope", R"({"pid": 100, "expiration_time": 1, "signal": 9})", "without \"scope_id\""},
      {"no expiration", R"({"pid": 100, "scope_id": "a", "signal": 9})",
       "without \"expiration_time\""},
      {"no signal", R"({"pid": 100, "scope_id": "a", "expiration_time": 1})", "without \"signal\""},
      {"pid 0", R"({"pid": 0, "scope_id": "a", "expiration_time": 1, "signal": 9})",
       "pid 0 is not a process id"},
      {"pid -1", R"({"pid": -1, "scope_id": "a", "expiration_time": 1, "signal": 9})",
       "pid -1 is not"},
      {"pid over pid_t",
       R"({"pid": 4294967396, "scope_id": "a", "expiration_time": 1, "signal": 9})", "is not a"},
      {"signal 65", R"({"pid": 100, "scope_id": "a", "expiration_time": 1, "signal": 65})",
       "signal 65"},
      {"signal over int32",
       R"({"pid": 100, "scope_id": "a", "expiration_time": 1, "signal": 1e12})", "not a"},
      {"NaN", R"({"pid": 100, "scope_id": "a", "expiration_time": "NaN", "signal": 9})",
       "not a finite number"},
      {"Infinity", R"({"pid": 100, "scope_id": "a", "expiration_time": "Infinity", "signal": 9})",
       "not a finite"},
      {"control characters", "{\"pid\": \"\x1b[31m\x07\", \"scope_id\": 1}", "not a timer request"},
      {"long scope",
       absl::StrCat(R"({"pid": 100, "scope_id": ")", long_scope,
                    R"(", "expiration_time": 1, "signal": 9})"),
       "a scope_id of 1025 bytes"},
  };
  for (const BadLine& b : bad) {
    SCOPED_TRACE(b.name);
    TimerTable t;
    t.AddWorker(100, 0);
    std::vector<std::string> warnings = t.Feed(b.line + "\n" + b.line + "\n");
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_THAT(warnings[0], HasSubstr(b.warning));
    EXPECT_TRUE(std::all_of(warnings[0].begin(), warnings[0].end(), [](char c) {
      return c >= ' ' && c < 127;
    })) << warnings[0];
    EXPECT_EQ(t.counts().invalid, 2);
    EXPECT_EQ(t.size(), 0u);
    // A good request after it is taken.
    EXPECT_THAT(t.Feed(Line(100, "good", 1.0, SIGKILL)), IsEmpty());
    EXPECT_EQ(t.size(), 1u);
  }
}

TEST(TimerTable, TorchsOwnLinesAreTakenWithFieldsItMayAddAndBlankLinesSkipped) {
  TimerTable t;
  t.AddWorker(4242, 0);
  // As json.dumps writes them (torch 1.13 to 2.x), with a field a later version might add.
  EXPECT_THAT(
      t.Feed(
          "{\"version\": 1, \"pid\": 4242, \"scope_id\": \"/w/train.py#30\", \"expiration_time\": "
          "1700000001.5, \"signal\": 9, \"hostname\": \"n1\"}\n\n  \n"
          "{\"version\": 1, \"pid\": 4242, \"scope_id\": \"x\", \"expiration_time\": 1700000000, "
          "\"signal\": -3}\n"),
      IsEmpty());
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.counts().ignored(), 0);
  // A negative signal is torch's "no signal".
  EXPECT_THAT(Expired(&t, 1700000000.0), ElementsAre("4242:x:0"));
}

TEST(TimerTable, ALineSplitAcrossReadsIsJoined) {
  TimerTable t;
  t.AddWorker(100, 0);
  const std::string line = Line(100, "a", 5.0, SIGKILL);
  for (size_t i = 0; i < line.size(); ++i) EXPECT_THAT(t.Feed(line.substr(i, 1)), IsEmpty());
  EXPECT_EQ(t.size(), 1u);
}

TEST(TimerTable, AnOverlongLineIsDroppedUpToItsNewline) {
  TimerTable t;
  t.AddWorker(100, 0);
  const std::string chunk(1000, 'x');
  std::vector<std::string> warnings;
  for (int i = 0; i < 10; ++i) {
    for (auto& w : t.Feed(chunk)) warnings.push_back(w);
  }
  for (auto& w : t.Feed("\n" + Line(100, "after", 5.0, SIGKILL))) warnings.push_back(w);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("a line over 4096 bytes"));
  EXPECT_EQ(t.counts().overlong, 1);
  EXPECT_EQ(t.counts().invalid, 0);  // the tail of the long line was not read as a line of its own
  EXPECT_EQ(t.size(), 1u);
  // The longest line that is taken: exactly kMaxTimerRequestBytes before its newline.
  std::string max_line = Line(100, "b", 5.0, SIGKILL);
  max_line.insert(1, kMaxTimerRequestBytes - max_line.size() + 1, ' ');
  ASSERT_EQ(max_line.size(), kMaxTimerRequestBytes + 1);
  t.Feed(max_line);
  EXPECT_EQ(t.size(), 2u);
}

TEST(TimerTable, NoMoreThanTheLimitOfTimersIsHeld) {
  TimerTable t;
  t.AddWorker(100, 0);
  std::string lines;
  for (size_t i = 0; i < kMaxLiveTimers; ++i)
    lines += Line(100, absl::StrCat("s", i), 5.0, SIGKILL);
  EXPECT_THAT(t.Feed(lines), IsEmpty());
  std::vector<std::string> warnings = t.Feed(Line(100, "one-more", 5.0, SIGKILL));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("4096 are held already"));
  EXPECT_EQ(t.counts().full, 1);
  // A held one can still move, and a released one makes room.
  EXPECT_THAT(t.Feed(Line(100, "s0", 9.0, SIGKILL) + Line(100, "s1", -1, 0) +
                     Line(100, "one-more", 5.0, SIGKILL)),
              IsEmpty());
  EXPECT_EQ(t.size(), kMaxLiveTimers);
}

TEST(FileTimerPath, TorchrunsSwitchAndPath) {
  EXPECT_EQ(FileTimerPath({}, "abc"), std::nullopt);
  EXPECT_EQ(FileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "0"}}, "abc"), std::nullopt);
  EXPECT_EQ(FileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "true"}}, "abc"),
            std::nullopt);  // torch: only "1"
  EXPECT_EQ(FileTimerPath({{"TORCHELASTIC_TIMER_FILE", "/x/t"}}, "abc"), std::nullopt);
  EXPECT_EQ(FileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}}, "abc"),
            "/tmp/watchdog_timer_abc");
  EXPECT_EQ(FileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TMPDIR", "/scratch"}}, "abc"),
            "/scratch/watchdog_timer_abc");
  EXPECT_EQ(
      FileTimerPath({{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", "/x/t"}},
                    "abc"),
      "/x/t");
  EXPECT_EQ(FileTimerPath(
                {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}, {"TORCHELASTIC_TIMER_FILE", ""}}, "abc"),
            "/tmp/watchdog_timer_abc");
}

// ---- The server on a real FIFO ----

// Seconds since the epoch as the test sets them: the clients' time.time(), moved by hand.
struct FakeWallClock {
  std::atomic<double> now{1700000000.0};
  std::function<double()> Fn() {
    return [this] { return now.load(); };
  }
};

// Writes as torch's client does: a non-blocking open, which fails when nobody reads.
bool ClientWrite(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// A child that waits to be signalled (with none blocked: other tests of this binary block some).
pid_t StartSleeper() {
  pid_t pid = ::fork();
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (;;) ::pause();
  }
  return pid;
}

// The signal that ended `pid` (reaped here), or -1 when it has not ended by the deadline.
int WaitForSignal(pid_t pid) {
  int status = 0;
  if (!WaitUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; })) return -1;
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

// A server's options on dir/timer with the fake clock, counting its expiries in `expired`.
FileTimerServer::Options ServerOptions(const TempDir& dir, FakeWallClock& clock, std::atomic<int>& expired) {
  FileTimerServer::Options o;
  o.path = dir / "timer";
  o.now = clock.Fn();
  o.on_expired = [&expired](const TimerExpiry&) { ++expired; };
  return o;
}

TEST(FileTimerServer, MakesAnOwnerOnlyFifoThatClientsCanWriteAndRemovesItOnStop) {
  TempDir dir;
  FileTimerServer server({dir / "timer"});
  ASSERT_TRUE(server.Start().ok());
  struct stat st {};
  ASSERT_EQ(::lstat((dir / "timer").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(ClientWrite(dir / "timer", Line(1, "a", -1, 0)));
  server.Stop();
  EXPECT_NE(::lstat((dir / "timer").c_str(), &st), 0);
  EXPECT_FALSE(ClientWrite(dir / "timer", Line(1, "a", -1, 0)));
}

TEST(FileTimerServer, RefusesAPathThatIsNotAFifoOfItsOwn) {
  TempDir dir;
  testing::WriteFile(dir / "file", "keep me");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  ASSERT_EQ(::symlink((dir / "fifo").c_str(), (dir / "link").c_str()), 0);
  for (const char* name : {"file", "link"}) {
    FileTimerServer server({dir / name});
    absl::Status st = server.Start();
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << name;
    EXPECT_THAT(std::string(st.message()), HasSubstr("is not a FIFO of this user's")) << name;
  }
  EXPECT_EQ(testing::ReadFile(dir / "file"), "keep me");
  FileTimerServer no_dir({dir / "none/timer"});
  EXPECT_THAT(std::string(no_dir.Start().message()), HasSubstr("cannot make the FIFO"));
}

TEST(FileTimerServer, ReplacesAFifoAnEarlierRunLeftWithAnOwnerOnlyOne) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "timer").c_str(), 0600), 0);
  ASSERT_EQ(::chmod((dir / "timer").c_str(), 0666), 0);
  FileTimerServer server({dir / "timer"});
  ASSERT_TRUE(server.Start().ok());
  struct stat st {};
  ASSERT_EQ(::lstat((dir / "timer").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(FileTimerServer, SignalsAWorkerWhoseTimerExpiredAndNoOtherProcess) {
  TempDir dir;
  FakeWallClock clock;
  std::atomic<int> expired{0};
  std::string scope;
  FileTimerServer::Options o = ServerOptions(dir, clock, expired);
  o.reap_interval = std::chrono::milliseconds(5);
  o.on_expired = [&](const TimerExpiry& e) {
    scope = e.scope_id;
    ++expired;
  };
  FileTimerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const pid_t worker = StartSleeper(), stranger = StartSleeper();
  server.AddWorker(worker, 7);
  ASSERT_TRUE(ClientWrite(o.path, Line(worker, "step", clock.now + 1, SIGKILL) +
                                      Line(stranger, "step", clock.now + 1, SIGKILL)));
  ASSERT_TRUE(
      WaitUntil([&] { return server.counts().set == 1 && server.counts().held == 1; }));
  EXPECT_EQ(expired, 0);  // not before its time
  clock.now = clock.now + 1;
  EXPECT_EQ(WaitForSignal(worker), SIGKILL);
  ASSERT_TRUE(WaitUntil([&] { return expired == 1; }));
  EXPECT_EQ(scope, "step");
  EXPECT_EQ(::kill(stranger, 0), 0);  // the pid that is no worker is left alone
  ::kill(stranger, SIGKILL);
  EXPECT_EQ(WaitForSignal(stranger), SIGKILL);
}

// A timer a worker wrote before the agent added it (a warm worker's) is taken when it is added,
// and the server's thread, waiting with no timer to expire, is woken to signal it: here the
// timer has expired already when the worker is added.
TEST(FileTimerServer, ATimerWrittenBeforeItsWorkerWasAddedExpires) {
  TempDir dir;
  FakeWallClock clock;
  std::atomic<int> expired{0};
  const FileTimerServer::Options o = ServerOptions(dir, clock, expired);
  FileTimerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const pid_t worker = StartSleeper();
  ASSERT_TRUE(ClientWrite(o.path, Line(worker, "step", clock.now + 1, SIGKILL)));
  ASSERT_TRUE(WaitUntil([&] { return server.counts().held == 1; }));
  clock.now = clock.now + 2;
  server.AddWorker(worker, 1);
  const int sig = WaitForSignal(worker);
  if (sig == -1) {  // never signalled: not left behind
    ::kill(worker, SIGKILL);
    ::waitpid(worker, nullptr, 0);
  }
  EXPECT_EQ(sig, SIGKILL);
  ASSERT_TRUE(WaitUntil([&] { return expired == 1; }));
  EXPECT_EQ(server.counts().held, 0);
}

TEST(FileTimerServer, AReapedWorkersTimerSignalsNothing) {
  TempDir dir;
  FakeWallClock clock;
  std::atomic<int> expired{0};
  FileTimerServer::Options o = ServerOptions(dir, clock, expired);
  o.reap_interval = std::chrono::milliseconds(5);
  FileTimerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const pid_t worker = StartSleeper();
  server.AddWorker(worker, 0);  // its pidfd is taken now
  ASSERT_TRUE(ClientWrite(o.path, Line(worker, "a", clock.now + 1, SIGKILL)));
  ASSERT_TRUE(WaitUntil([&] { return server.counts().set == 1; }));
  ::kill(worker, SIGTERM);
  EXPECT_EQ(WaitForSignal(worker), SIGTERM);  // reaped: its pid may be another process's now
  clock.now = clock.now + 2;
  ASSERT_TRUE(WaitUntil([&] { return expired == 1; }));  // handled, through the pidfd: ESRCH
}

}  // namespace
}  // namespace launch
