// Integration tests: the real `launch` binary with test_worker (and one Python script).
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/net.h"
#include "common/unique_fd.h"
#include "launch.grpc.pb.h"
#include <grpcpp/grpcpp.h>
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kLaunch = LAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;
constexpr long long LineRelayPiece = 64 * 1024;  // LineRelay::kMaxLineBytes

std::vector<std::string> Cmd(std::vector<std::string> launch_args, std::vector<std::string> worker_args) {
  std::vector<std::string> argv = {kLaunch};
  argv.insert(argv.end(), launch_args.begin(), launch_args.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

std::vector<std::string> Lines(const std::string& s) {
  return absl::StrSplit(s, '\n', absl::SkipEmpty());
}

int CountLines(const std::string& s, const std::string& needle) {
  int n = 0;
  for (const auto& l : Lines(s)) n += absl::StrContains(l, needle);
  return n;
}

// The TCP ports process `pid` listens on (its socket inodes matched in /proc/net/tcp{,6}).
std::vector<int> ListeningTcpPorts(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(fd_dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && absl::StartsWith(target, "socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<int> ports;
  for (const auto& line : Lines(ReadFile("/proc/net/tcp") + ReadFile("/proc/net/tcp6"))) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 10 || f[3] != "0A" || !inodes.count(f[9])) continue;  // 0A: LISTEN
    ports.push_back(std::stoi(f[1].substr(f[1].find(':') + 1), nullptr, 16));
  }
  return ports;
}

// Live processes (zombies excluded) with `arg` among their arguments.
std::vector<pid_t> ProcessesWithArg(const std::string& arg) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e.path().filename().string(), &pid)) continue;
    const std::string cmdline = ReadFile(e.path().string() + "/cmdline");
    for (absl::string_view a : absl::StrSplit(cmdline, '\0')) {
      if (a == arg && ProcessAlive(pid)) out.push_back(pid);
    }
  }
  return out;
}

bool AllDead(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (ProcessAlive(p)) return false;
  return true;
}

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

TEST(Launch, WorkerLeftoverChildrenAreStoppedAtTheEnd) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=1"}, {"--grandchild", dir / "gc", "--exit", "0"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("left processes in its group"));
  EXPECT_TRUE(AllDead(ReadPids(dir / "gc")));
}

TEST(Launch, LinesWrittenByteByByteComeOutWholeAndUnmixed) {
  std::string text(300, 'x');
  auto r = RunCmd(Cmd({"--nproc-per-node=2"}, {"--partial", text, "--partial", text}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  for (const auto& l : lines) EXPECT_TRUE(l == "[0]:" + text || l == "[1]:" + text) << l;
}

// A console that stops reading (a full pipe, a paused terminal) blocked launch's supervision
// loop in its writes: a failed worker was never reaped and the restart never came. Now rank 1's
// failure is seen and the group restarts and gives up on schedule while stdout is not read; rank
// 0, whose output waits, is stopped like any worker, and launch still writes all it was given.
// Each rank writes a line and waits for the other before rank 1 fails: else rank 0 could be
// stopped before its first write (a restart takes milliseconds).
TEST(Launch, AConsoleThatStopsReadingDoesNotDelayARestart) {
  TempDir dir;
  const std::string ready = dir / "ready.{restart}";
  Child c(Cmd({"--nproc-per-node=2", "--max-restarts=1", "--stop-timeout=5"},
              {"--spew", "100", "--pid-file", ready, "--wait-lines", ready, "2", "--fail-rank", "1", "3", "--spew", "0"}));
  c.PauseStdout(true);
  const bool ended = WaitUntil([&] {
    c.Pump(20);
    return absl::StrContains(c.err(), "worker group failed after 1 restart");
  }, std::chrono::seconds(60));
  EXPECT_TRUE(ended) << c.err();
  EXPECT_THAT(c.err(), HasSubstr("restarting the group (1 of 1 restarts)"));
  c.PauseStdout(false);
  auto r = c.Wait();
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:" + std::string(99, 'x') + "\n"));
}

// 200 MB without a newline took launch from 15 MB to 220 MB. Now its peak stays under 64 MiB
// (ru_maxrss of this test's largest child: launch, or its small worker), and all of it is shown.
TEST(Launch, TwoHundredMegabytesWithoutANewlineKeepLaunchSmall) {
  const long long kBytes = 200ll << 20;
  auto r = RunCmd(Cmd({"--nproc-per-node=1"}, {"--spew-unended", std::to_string(kBytes)}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rusage usage{};
  ASSERT_EQ(::getrusage(RUSAGE_CHILDREN, &usage), 0);
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's shadow memory and quarantine are not launch's: the bound is checked in the
  // other builds.
  (void)usage;
#else
  EXPECT_LT(usage.ru_maxrss, 64 << 10) << "KiB";
#endif
  const size_t pieces = (kBytes + LineRelayPiece - 1) / LineRelayPiece;
  EXPECT_EQ(r.out.size(), static_cast<size_t>(kBytes) + pieces * std::string("[0]:\n").size());
}

// With pdb.set_trace() or input(), a worker read the terminal from its own process group and was
// stopped by SIGTTIN: launch hung. Rank 0 now reads the terminal through launch (the prompt is
// shown though it has no newline), the other ranks read /dev/null.
TEST(Launch, RankZeroReadsTheTerminal) {
  int master = -1;
  std::vector<std::string> argv = Cmd({"--nproc-per-node=2"}, {"--read-line", "name? "});
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  std::string out;
  auto read_until = [&](const std::string& needle) {
    return WaitUntil([&] {
      pollfd p{master, POLLIN, 0};
      char buf[4096];
      while (::poll(&p, 1, 10) == 1) {
        ssize_t n = ::read(master, buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
      }
      return absl::StrContains(out, needle);
    }, std::chrono::seconds(30));
  };
  EXPECT_TRUE(read_until("[0]:name? ")) << out;
  EXPECT_TRUE(read_until("got EOF")) << out;  // rank 1, on its prompt's line or its own
  ASSERT_EQ(::write(master, "hello\n", 6), 6);
  EXPECT_TRUE(read_until("[0]:got hello")) << out;
  int status = 0;
  const bool exited = WaitUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; });
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  EXPECT_TRUE(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  ::close(master);
}

// stdin that is not a terminal (a pipe, a file) goes to rank 0 as it is; the others read EOF.
TEST(Launch, RankZeroReadsAPipedStdin) {
  Pipe in;
  ASSERT_TRUE(MakePipe(&in));
  ASSERT_EQ(::write(in.write.get(), "abc\n", 4), 4);
  in.write.Reset();
  Child c(Cmd({"--nproc-per-node=2"}, {"--read-line", ""}), {}, in.read.get());
  auto r = c.Wait();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:got abc\n"));
  EXPECT_THAT(r.out, HasSubstr("[1]:got EOF\n"));
}

TEST(Launch, LogDirLayoutRedirectsAndTee) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--log-dir", dir.path(), "--rdzv-id", "job1", "--redirects", "3",
                    "--tee", "0:1"},
                   {"--print-env", "RANK", "--stderr", "err-line"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int lr : {0, 1}) {
    std::string base = dir.path() + "/job1/attempt_0/" + std::to_string(lr);
    EXPECT_EQ(ReadFile(base + "/stdout.log"), "RANK=" + std::to_string(lr) + "\n");
    EXPECT_EQ(ReadFile(base + "/stderr.log"), "err-line\n");
  }
  // Redirected streams leave the console, except local rank 0's stdout, which is teed.
  EXPECT_THAT(r.out, HasSubstr("[0]:RANK=0"));
  EXPECT_THAT(r.out, Not(HasSubstr("[1]:RANK=1")));
  EXPECT_THAT(r.err, Not(HasSubstr("err-line")));
}

TEST(Launch, LogDirKeepsErrorFileAndAttempts) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=1", "--max-restarts=1", "--log-dir", dir.path(), "--rdzv-id", "j"},
                   {"--print-env", "TORCHELASTIC_RESTART_COUNT", "--error-file", "RuntimeError: boom", "--exit", "1"}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  for (int k : {0, 1}) {
    std::string attempt = dir.path() + "/j/attempt_" + std::to_string(k) + "/0";
    EXPECT_THAT(ReadFile(attempt + "/error.json"), HasSubstr("RuntimeError: boom"));
    EXPECT_EQ(ReadFile(attempt + "/stdout.log"), "TORCHELASTIC_RESTART_COUNT=" + std::to_string(k) + "\n");
  }
  EXPECT_THAT(r.err, HasSubstr("logs in " + dir.path() + "/j/attempt_1"));
}

// SIGSTOP/SIGCONT of launch (or a paused VM) for longer than the heartbeat timeout restarted
// healthy workers: the in-process coordinator expired its own agent's lease. A single node needs
// no lease to itself, and the coordinator forgives time it did not run.
TEST(Launch, StoppingLaunchForAWhileDoesNotRestartItsWorkers) {
  TempDir dir;
  Child c(Cmd({"--nproc-per-node=1", "--rdzv-conf=heartbeat_timeout=1,heartbeat_interval=0.2"},
              {"--pid-file", dir / "pids", "--wait-lines", dir / "go", "1", "--exit", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    c.Pump(1);
    return ReadPids(dir / "pids").size() == 1;
  }));
  ::kill(c.pid(), SIGSTOP);
  for (int i = 0; i < 300; ++i) c.Pump(10);  // the stimulus: stopped for 3 s
  ::kill(c.pid(), SIGCONT);
  EXPECT_TRUE(WaitUntil([&] {
    c.Pump(5);
    return absl::StrContains(c.err(), "did not run for");
  })) << c.err();
  WriteFile(dir / "go", "go\n");
  auto r = c.Wait();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadPids(dir / "pids").size(), 1u) << "the worker was restarted: " << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("lost node")));
}

// A single node's coordinator listened on loopback with no token: any local user could send it
// a forged heartbeat. Every call then needed a token only launch knew; now a single node's
// rendezvous is no server at all, so its job listens on the workers' store (MASTER_PORT) alone,
// which speaks no gRPC. With --metrics-port the gRPC coordinator is back (the endpoint serves its
// status), and it still refuses calls without the token.
TEST(Launch, ASingleNodeJobListensOnlyWhereItsWorkersNeedIt) {
  for (bool metrics : {false, true}) {
    TempDir dir;
    std::vector<std::string> flags = {"--nproc-per-node=1"};
    int metrics_port = 0;
    if (metrics) {
      auto free = PickFreePort("127.0.0.1");
      ASSERT_TRUE(free.ok()) << free.status();
      metrics_port = *free;
      flags.push_back("--metrics-port=" + std::to_string(metrics_port));
    }
    // The metrics endpoint's scrapers need a token; it is then the coordinator's too.
    std::vector<std::string> env;
    if (metrics) env.push_back("LAUNCH_RDZV_TOKEN=a-token-for-the-scrapers");
    Child c(Cmd(flags, {"--pid-file", dir / "pids", "--print-env", "MASTER_PORT", "--wait-lines", dir / "go", "1",
                        "--exit", "0"}),
            env);
    ASSERT_TRUE(WaitUntil([&] {
      c.Pump(1);
      return ReadPids(dir / "pids").size() == 1 && absl::StrContains(c.out(), "MASTER_PORT=");
    }));
    const std::string out = c.out();
    const int store_port = std::stoi(out.substr(out.find("MASTER_PORT=") + 12));
    std::vector<int> ports = ListeningTcpPorts(c.pid());
    ports.erase(std::remove(ports.begin(), ports.end(), metrics_port), ports.end());
    ASSERT_EQ(ports.size(), metrics ? 2u : 1u) << "metrics " << metrics;
    EXPECT_EQ(std::count(ports.begin(), ports.end(), store_port), 1);
    for (int port : ports) {
      auto stub = v1::Rendezvous::NewStub(
          grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::HeartbeatRequest hb;
      hb.set_run_id("any");
      hb.set_node_id("intruder");
      v1::HeartbeatResponse resp;
      grpc::Status st = stub->Heartbeat(&ctx, hb, &resp);
      if (port == store_port) {
        EXPECT_FALSE(st.ok());
        continue;
      }
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << port << ": " << st.error_message();
    }
    WriteFile(dir / "go", "go\n");
    auto r = c.Wait();
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
}

// A rerun with the same --rdzv-id and --log-dir appended to the old files: the old run's
// unfinished line was glued to the new run's first. Each run now gets a directory of its own.
TEST(Launch, ARerunNeverWritesIntoAnEarlierRunsFiles) {
  TempDir dir;
  for (const char* word : {"first", "second", "third"}) {
    auto r = RunCmd(Cmd({"--nproc-per-node=1", "--log-dir", dir.path(), "--rdzv-id", "same", "--redirects=1"},
                        {"--partial", word, "--spew-unended", "3"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_EQ(ReadFile(dir / "same/attempt_0/0/stdout.log"), "first\nxxx");
  EXPECT_EQ(ReadFile(dir / "same.1/attempt_0/0/stdout.log"), "second\nxxx");
  EXPECT_EQ(ReadFile(dir / "same.2/attempt_0/0/stdout.log"), "third\nxxx");
}

// --nproc-per-node=12000 started about 10,000 workers before it ran out of descriptors and
// said "nothing started". What a plan needs is checked against the open-file limit first.
TEST(Launch, APlanBeyondTheOpenFileLimitIsRefusedBeforeAnythingStarts) {
  TempDir dir;
  auto r = RunCmd({"/usr/bin/prlimit", "--nofile=100:100", kLaunch, "--nproc-per-node=40", kWorker, "--pid-file",
                   dir / "started"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--nproc-per-node=40: 40 workers need about 144 open files, and the limit is 100"));
  EXPECT_FALSE(std::filesystem::exists(dir / "started"));
  // Within the limit, the same plan runs.
  auto ok = RunCmd({"/usr/bin/prlimit", "--nofile=100:100", kLaunch, "--nproc-per-node=16", kWorker, "--exit", "0"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(Launch, LocalRanksFilterLimitsTheConsoleOnly) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--local-ranks-filter=1", "--log-dir", dir.path(), "--rdzv-id", "f"},
                   {"--print-env", "RANK"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("[0]:")));
  EXPECT_THAT(r.out, HasSubstr("[1]:RANK=1"));
  EXPECT_EQ(ReadFile(dir.path() + "/f/attempt_0/0/stdout.log"), "RANK=0\n");
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

TEST(Launch, DryRunPrintsArgvAndEnvAndStartsNothing) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--dry-run"}, {"--pid-file", dir / "pids", "${local_rank}"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("rank 1 (local rank 1):"));
  EXPECT_THAT(r.out, HasSubstr("WORLD_SIZE=2"));
  EXPECT_THAT(r.out, HasSubstr(dir / "pids 1"));
  EXPECT_FALSE(std::filesystem::exists(dir / "pids"));
}

// Kubeflow's PyTorchJob gives torchrun its topology as PET_<FLAG> variables; launch reads them
// the same way.
TEST(Launch, PetVariablesPlanTheWorkersAsTorchrunsFlagsWould) {
  auto r = RunCmd(Cmd({"--dry-run"}, {}), {"PET_NPROC_PER_NODE=2", "PET_RDZV_ID=from-pet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("rank 1 (local rank 1):"));
  EXPECT_THAT(r.out, Not(HasSubstr("rank 2 (local rank 2):")));
  EXPECT_THAT(r.out, HasSubstr("TORCHELASTIC_RUN_ID=from-pet"));
  auto bad = RunCmd(Cmd({"--dry-run"}, {}), {"PET_NPROC_PER_NODE=many"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("PET_NPROC_PER_NODE=many"));
}

// Under srun with one task per node, Slurm's variables alone plan the node; the header says which
// value came from where.
TEST(Launch, SlurmVariablesAlonePlanTheNode) {
  const std::vector<std::string> slurm = {"SLURM_JOB_ID=4321",          "SLURM_STEP_ID=0", "SLURM_NNODES=4",
                                          "SLURM_NODEID=2",             "SLURM_NTASKS=4",
                                          "SLURM_JOB_NODELIST=node[01-04]"};
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--dry-run"}, {}), slurm);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("launch --dry-run: node rank 2 of 4, 2 worker(s) on this node, rendezvous at node01:"));
  EXPECT_THAT(r.out, HasSubstr("SLURM_JOB_NODELIST (first host)"));
  EXPECT_THAT(r.out, HasSubstr("rank 4 (local rank 0):"));
  EXPECT_THAT(r.out, HasSubstr("rank 5 (local rank 1):"));
  EXPECT_THAT(r.out, HasSubstr("WORLD_SIZE=8"));
  EXPECT_THAT(r.out, HasSubstr("GROUP_RANK=2"));
  EXPECT_THAT(r.out, HasSubstr("TORCHELASTIC_RUN_ID=4321.0"));
  // Flags still win.
  auto flags = RunCmd(Cmd({"--nnodes=1", "--dry-run"}, {}), slurm);
  ASSERT_EQ(flags.exit_code, 0) << flags.err;
  EXPECT_THAT(flags.out, HasSubstr("node rank 0 of 1, 1 worker(s)"));
  EXPECT_THAT(flags.out, HasSubstr("--nnodes"));
  // Two tasks per node would start every worker twice.
  std::vector<std::string> two = slurm;
  two.push_back("SLURM_STEP_NUM_TASKS=8");
  auto bad = RunCmd(Cmd({"--dry-run"}, {}), two);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("srun started 8 tasks on 4 node(s)"));
  EXPECT_THAT(bad.err, HasSubstr("srun --ntasks-per-node=1"));
}

// torchrun's --log-line-prefix-template, and the default that tells nodes apart on several.
TEST(Launch, LogLinePrefixTemplateAndTheMultiNodeDefault) {
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--role=trainer", "--log-line-prefix-template=<${role_name}:${local_rank}> "},
                      {"--print-env", "RANK"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("<trainer:0> RANK=0\n"));
  EXPECT_THAT(r.out, HasSubstr("<trainer:1> RANK=1\n"));
  auto env = RunCmd(Cmd({}, {"--print-env", "RANK"}), {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=${rank}|"});
  ASSERT_EQ(env.exit_code, 0) << env.err;
  EXPECT_THAT(env.out, HasSubstr("0|RANK=0\n"));
  auto bad = RunCmd(Cmd({"--log-line-prefix-template=${gpu}"}, {}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--log-line-prefix-template=${gpu}: '${gpu}' is unknown"));
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  auto static_node = RunCmd(
      Cmd({"--rdzv-backend=static", "--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1"}, {"--print-env", "RANK"}));
  ASSERT_EQ(static_node.exit_code, 0) << static_node.err;
  EXPECT_THAT(static_node.out, HasSubstr(std::string("[") + host + ":1]:RANK=1\n"));
}

// torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters: matching lines of every
// worker in attempt_<k>/filtered_std{out,err}.log; --virtual-local-rank: LOCAL_RANK 0 everywhere.
TEST(Launch, DuplicateFiltersAndVirtualLocalRank) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--log-dir", dir.path(), "--rdzv-id=filters", "--virtual-local-rank",
                       "--duplicate-stdout-filters=RANK=1", "--duplicate-stderr-filters=err-,,line"},
                      {"--print-env", "LOCAL_RANK,RANK", "--stderr", "err-,line", "--stderr", "other"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:LOCAL_RANK=0\n"));
  EXPECT_THAT(r.out, HasSubstr("[1]:LOCAL_RANK=0\n"));
  EXPECT_EQ(ReadFile(dir / "filters/attempt_0/filtered_stdout.log"), "[1]:RANK=1\n");
  const std::string err = ReadFile(dir / "filters/attempt_0/filtered_stderr.log");
  EXPECT_EQ(CountLines(err, "err-,line"), 2) << err;
  EXPECT_THAT(err, Not(HasSubstr("other")));
  // Each rank's own log keeps its real local rank.
  EXPECT_THAT(ReadFile(dir / "filters/attempt_0/1/stdout.log"), HasSubstr("RANK=1"));
}

// --numa-binding on a fake /sys (LAUNCH_SYSFS_ROOT) made of the CPUs this test may use: the dry
// run shows each worker's binding, and a real run's workers run on exactly their CPUs.
TEST(Launch, NumaBindingFollowsTheTopology) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two usable CPUs, has " << cpus.size();
  const std::string a = std::to_string(cpus[0]), b = std::to_string(cpus[1]);
  TempDir two_nodes, one_node;
  auto cpu_dir = [](const TempDir& d, const std::string& id) { return d / ("devices/system/cpu/cpu" + id); };
  auto write = [](const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    WriteFile(path, text + "\n");
  };
  write(two_nodes / "devices/system/node/node0/cpulist", a);
  write(two_nodes / "devices/system/node/node1/cpulist", b);
  write(one_node / "devices/system/node/node0/cpulist", a + "," + b);
  for (const std::string& id : {a, b}) {
    write(cpu_dir(one_node, id) + "/topology/thread_siblings_list", id);
    write(cpu_dir(two_nodes, id) + "/topology/thread_siblings_list", id);
  }
  auto dry = RunCmd({kLaunch, "--numa-binding=node", "--nproc-per-node=2", "--dry-run", "--no-python", "/bin/true"},
                    {"LAUNCH_SYSFS_ROOT=" + two_nodes.path()});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("numa_binding       node"));
  EXPECT_THAT(dry.out, HasSubstr("numa: CPUs " + a + ", memory preferred on node 0 (node 0 (no GPU: 2 worker(s) over 2 "
                                 "node(s)))"));
  EXPECT_THAT(dry.out, HasSubstr("numa: CPUs " + b + ", memory preferred on node 1"));

  auto run = RunCmd({kLaunch, "--numa-binding=exclusive", "--nproc-per-node=2", "--no-python", "/bin/grep",
                     "Cpus_allowed_list", "/proc/self/status"},
                    {"LAUNCH_SYSFS_ROOT=" + one_node.path()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("[0]:Cpus_allowed_list:\t" + a + "\n"));
  EXPECT_THAT(run.out, HasSubstr("[1]:Cpus_allowed_list:\t" + b + "\n"));

  auto bad = RunCmd({kLaunch, "--numa-binding=numa", "/bin/true"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--numa-binding=numa: expected node, socket, exclusive or core-complex"));
  auto crowded = RunCmd({kLaunch, "--numa-binding=exclusive", "--nproc-per-node=3", "--no-python", "/bin/true"},
                        {"LAUNCH_SYSFS_ROOT=" + one_node.path()});
  EXPECT_EQ(crowded.exit_code, 2);
  EXPECT_THAT(crowded.err, HasSubstr("has 2 physical core(s) for 3 workers"));
}

TEST(Launch, VersionIsOneLineAndExitZero) {
  auto r = RunCmd({LAUNCH_BIN, "--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::MatchesRegex("launch [0-9]+\\.[0-9]+\\.[0-9]+\n"));
}

TEST(Launch, ConfigFileSetsFlagsAndFlagsOverrideIt) {
  TempDir dir;
  WriteFile(dir / "job.yaml",
            "nproc_per_node: 2\n"
            "rdzv:\n"
            "  id: fromfile\n"
            "train:\n"
            "  base_lr: 0.1\n"
            "  per_worker_batch: 32\n"
            "  lr_scaling: linear\n");
  auto r = RunCmd(Cmd({"--config", dir / "job.yaml"},
                   {"--print-env", "TORCHELASTIC_RUN_ID,LAUNCH_LR,LAUNCH_GLOBAL_BATCH,WORLD_SIZE"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountLines(r.out, "TORCHELASTIC_RUN_ID=fromfile"), 2);
  EXPECT_EQ(CountLines(r.out, "LAUNCH_LR=0.2"), 2);
  EXPECT_EQ(CountLines(r.out, "LAUNCH_GLOBAL_BATCH=64"), 2);
  auto o = RunCmd(Cmd({"--config", dir / "job.yaml", "--nproc-per-node=1"}, {"--print-env", "WORLD_SIZE"}));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "[0]:WORLD_SIZE=1\n");
}

TEST(Launch, PythonScriptWithGlooAllreduce) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/allreduce.py"},
               PythonTorchEnv(), std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0/2 allreduce=3"));
  EXPECT_THAT(r.out, HasSubstr("[1]:rank 1/2 allreduce=3"));
}

// torch's own TCPStore client against the agent's store: every operation this torch's Python has
// (1.13 here; 2.6 in the Debian 13 run, where append, multi_get/set and check too), across ranks;
// then a process group through it.
TEST(Launch, TorchsStoreClientDoesEveryOperationOnTheAgentsStore) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/store_ops.py"},
                  {"PYTHON_EXEC=/usr/bin/python3"}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\\[0\\]:rank 0 attempt 0: 1[59] store checks passed"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\\[1\\]:rank 1 attempt 0: 1[59] store checks passed"));
}

// Keys of a failed attempt are gone in the next: torch 2.x workers do not prefix them per attempt
// as 1.x's do, so the store itself must start empty.
TEST(Launch, TheAgentsStoreForgetsTheLastAttemptsKeys) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "--max-restarts=1", std::string(TESTS_DIR) + "/python/store_ops.py"},
                  {"PYTHON_EXEC=/usr/bin/python3", "STORE_OPS_FAIL=1"}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_THAT(r.err, HasSubstr("rank 1 failed (exit 3)"));
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0 attempt 1: "));
  EXPECT_THAT(r.out, HasSubstr("[1]:rank 1 attempt 1: "));
}

// A Python worker that reports through the shipped launch_progress module is watched for hangs
// like a C++ one: rank 1 stops at step 3 (rank 0 waits for it in all_reduce), the agent has it
// dump its own Python stacks (faulthandler), names it with its frame, and the restart runs through.
TEST(Launch, AHungPythonRankIsNamedWithItsPythonStack) {
  LAUNCH_NEED_PYTHON_TORCH();
  TempDir dir;
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "--max-restarts=1", "--hang-timeout", "2", "--log-dir", dir / "logs",
                   "--rdzv-id", "pyhang", std::string(TESTS_DIR) + "/python/hang.py"},
                  PythonTorchEnv(), std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 failed (hung: no step for"));
  EXPECT_THAT(r.err, HasSubstr("stop_here (hang.py:"));
  EXPECT_THAT(r.out, HasSubstr("[0]:rank 0 done"));
  EXPECT_THAT(r.out, HasSubstr("[1]:rank 1 done"));
  const std::string stacks = ReadFile(dir / "logs/pyhang/attempt_0/1/py_stacks.txt");
  EXPECT_THAT(stacks, HasSubstr("in stop_here")) << stacks;
}

// Outside launch the module is a no-op, so a script that uses it runs anywhere.
// Where NVML answers (the fake library here, through launch's real loader), every sample carries
// each GPU's figures, and an XID the driver queued is a warning naming the GPU, once.
TEST(Launch, SamplesCarryTheGpusFiguresAndAnXidIsAWarning) {
  TempDir dir;
  WriteFile(dir / "gpus.txt",
            "system driver=550.54.15 cuda=12040\n"
            "gpu name=\"Fake A\" uuid=GPU-aaaa mem_total_mib=81559 mem_used_mib=1024 util=0 temp=45 "
            "power_mw=350000 sm_clock=1980 mem_clock=2619 cc=9.0 sms=132 ecc=0 xid=\n"
            "gpu name=\"Fake B\" uuid=GPU-bbbb mem_total_mib=40960 mem_used_mib=0 util=97 temp=50 "
            "power_mw=200000 sm_clock=1410 mem_clock=1215 cc=8.0 sms=108 ecc=2 xid=79\n");
  const std::string samples = dir / "logs/gpus/metrics.jsonl";
  auto r = RunCmd({LAUNCH_BIN, "--nproc-per-node=1", "--monitor-interval", "1", "--log-dir", dir / "logs", "--rdzv-id",
                   "gpus", TEST_WORKER_BIN, "--wait-lines", samples, "3"},
                  {std::string("LAUNCH_NVML_LIBRARY=") + FAKE_NVML_LIB, "FAKE_NVML_FILE=" + (dir / "gpus.txt")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("GPU 1 (Fake B) reported XID error(s) 79"));
  EXPECT_THAT(r.err, Not(HasSubstr("GPU 0 (Fake A) reported")));
  int lines = 0, xids = 0;
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(ReadFile(samples), '\n', absl::SkipEmpty()))) {
    ++lines;
    EXPECT_THAT(line, HasSubstr("\"gpus\":[{\"index\":0,\"name\":\"Fake A\",\"uuid\":\"GPU-aaaa\","
                                "\"utilization_percent\":0,\"memory_used_bytes\":\"1073741824\","
                                "\"memory_total_bytes\":\"85520809984\",\"temperature_c\":45,\"power_watts\":350,"
                                "\"sm_clock_mhz\":1980,\"memory_clock_mhz\":2619,\"ecc_uncorrected_errors\":\"0\","
                                "\"xids\":[]},{\"index\":1,\"name\":\"Fake B\""));
    xids += absl::StrContains(line, "\"xids\":[79]");
  }
  EXPECT_GE(lines, 3);
  EXPECT_EQ(xids, 1);  // drained by the first sample that read it
}

TEST(Launch, TheProgressModuleIsANoOpOutsideLaunch) {
  auto r = RunCmd({"/usr/bin/python3", "-c",
                   "import sys; sys.path.append('" + std::string(TESTS_DIR) +
                       "/../worker_sdk/python'); import launch_progress as p; r = p.Reporter(); r.step(1, 0.5); "
                       "p.step(2); print('enabled', r.enabled)"},
                  {"LAUNCH_PROGRESS_FD="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("enabled False"));
}

TEST(Launch, ModuleFlagRunsPythonDashM) {
  TempDir dir;
  WriteFile(dir / "probe_mod.py", "import os, sys\nprint('module', os.environ['RANK'], sys.stdout.write_through)\n");
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", "-m", "probe_mod"},
                  {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[0]:module 0 True"));  // -u (unbuffered), as torchrun
  EXPECT_THAT(r.out, HasSubstr("[1]:module 1 True"));
}

TEST(Launch, PythonRecordErrorFileReachesTheSummary) {
  LAUNCH_NEED_PYTHON_TORCH();
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", std::string(TESTS_DIR) + "/python/record_error.py"},
                  {"PYTHON_EXEC=/usr/bin/python3"}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("ValueError: rank 1 found a bad batch"));
  EXPECT_THAT(r.err, HasSubstr("<- root cause"));
}

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

// ---- bad input: one line naming the value, exit 2, nothing started ----

struct BadInput {
  std::string name;
  std::vector<std::string> launch_args;
  std::string expect;  // in the error line
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.name; }

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, OneLineErrorExit2NothingStarted) {
  TempDir dir;
  const BadInput& p = GetParam();
  std::vector<std::string> argv = {kLaunch};
  for (auto a : p.launch_args) {
    if (a.rfind("@", 0) == 0) a = dir / a.substr(1);  // @name: a file in the temp dir
    argv.push_back(a);
  }
  bool has_program = false;
  for (const auto& a : argv) has_program |= a == "PROGRAM";
  for (auto& a : argv)
    if (a == "PROGRAM") a = kWorker;
  if (!has_program && p.name != "missing_program" && p.name != "not_executable" &&
      p.name != "python_script_without_py")
    argv.push_back(kWorker);
  argv.push_back("--pid-file");
  argv.push_back(dir / "started");
  if (p.name == "yaml_syntax") WriteFile(dir / "bad.yaml", "nproc_per_node: 2\nrdzv: [unclosed\n");
  if (p.name == "yaml_unknown_key") WriteFile(dir / "bad.yaml", "nproc_per_node: 2\n\nnproc: 3\n");
  if (p.name == "token_not_ascii") WriteFile(dir / "token", "abcd\xc3\xa9" "fghijk\n");  // gRPC aborted on it
  if (p.name == "tls_cert_not_pem" || p.name == "tls_cert_without_key")
    WriteFile(dir / "cert.pem", "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
  if (p.name == "not_executable" || p.name == "python_script_without_py") {
    WriteFile(dir / "noexec", "#!/bin/sh\n");
    chmod((dir / "noexec").c_str(), 0644);
  }
  int busy = -1;
  if (p.name == "master_port_in_use") {
    busy = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(listen(busy, 1), 0);
    socklen_t len = sizeof a;
    getsockname(busy, reinterpret_cast<sockaddr*>(&a), &len);
    for (auto& arg : argv)
      if (arg == "--master-port=BUSY") arg = "--master-port=" + std::to_string(ntohs(a.sin_port));
  }
  auto r = RunCmd(argv);
  if (busy >= 0) close(busy);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr(p.expect));
  EXPECT_THAT(r.err, ::testing::StartsWith("launch: "));
  EXPECT_FALSE(std::filesystem::exists(dir / "started")) << "a worker started";
}

INSTANTIATE_TEST_SUITE_P(
    Launch, BadInputTest,
    ::testing::Values(
        BadInput{"unknown_flag", {"--frobnicate=1", "PROGRAM"}, "unknown flag '--frobnicate=1'"},
        BadInput{"nproc_zero", {"--nproc-per-node=0"}, "--nproc-per-node=0: expected a positive integer"},
        BadInput{"nproc_negative", {"--nproc-per-node=-1"}, "--nproc-per-node=-1: expected"},
        BadInput{"nproc_abc", {"--nproc-per-node=abc"}, "--nproc-per-node=abc: expected"},
        BadInput{"nnodes_reversed", {"--nnodes", "3:2"}, "--nnodes=3:2: expected N or MIN:MAX"},
        BadInput{"missing_program", {"/nonexistent/train"}, "'/nonexistent/train' does not exist"},
        BadInput{"not_executable", {"@noexec"}, "is not executable"},
        // torchrun runs it with python; launch said only "not executable".
        BadInput{"python_script_without_py", {"@noexec"}, "launch runs only .py scripts and -m modules through Python"},
        BadInput{"bad_endpoint", {"--rdzv-endpoint=host:99999"}, "--rdzv-endpoint=host:99999: port"},
        BadInput{"bad_endpoint_empty_host", {"--rdzv-endpoint=:29400"}, "--rdzv-endpoint=:29400: empty host"},
        BadInput{"yaml_syntax", {"--config", "@bad.yaml"}, "bad.yaml:3"},
        BadInput{"yaml_unknown_key", {"--config", "@bad.yaml"}, "bad.yaml:3: nproc: unknown key"},
        BadInput{"master_port_in_use", {"--master-port=BUSY"}, "already in use"},
        BadInput{"redirects_9", {"--redirects", "9"}, "--redirects=9"},
        BadInput{"tee_bad_map", {"--tee", "0:7"}, "--tee=0:7"},
        BadInput{"run_path", {"--run-path"}, "--run-path is not supported"},
        BadInput{"gpu_binding", {"--gpu-binding=spread"}, "--gpu-binding=spread: expected shared or isolate"},
        BadInput{"max_restarts", {"--max-restarts=-2"}, "--max-restarts=-2"},
        BadInput{"stop_timeout", {"--stop-timeout=soon"}, "--stop-timeout=soon"},
        BadInput{"hang_timeout", {"--hang-timeout=-1"}, "--hang-timeout=-1"},
        BadInput{"rdzv_conf", {"--rdzv-conf=join_timeout"}, "--rdzv-conf=join_timeout"},
        // These exited 1, aborted, or (huge seconds) SIGKILLed the workers at once.
        BadInput{"stop_timeout_huge", {"--stop-timeout=1e10"}, "--stop-timeout=1e10: expected a number of seconds"},
        BadInput{"restart_backoff_huge", {"--restart-backoff=1e10"}, "--restart-backoff=1e10"},
        BadInput{"join_timeout_tiny", {"--rdzv-conf=join_timeout=1e-9"}, "join_timeout in 0.001.."},
        BadInput{"rdzv_id_too_long", {"--rdzv-id=" + std::string(129, 'x')}, "expected at most 128 characters"},
        // With --log-dir X/inner, logs went to X/ itself.
        BadInput{"rdzv_id_dot_dot", {"--rdzv-id=..", "--log-dir=@inner"}, "--rdzv-id=..: expected a name"},
        BadInput{"nproc_huge", {"--nproc-per-node=100000"}, "--nproc-per-node=100000: expected at most 4096"},
        BadInput{"config_is_a_directory", {"--config=/tmp"}, "--config=/tmp: not a regular file"},
        BadInput{"token_not_ascii", {"--rdzv-token-file", "@token"}, "the token's byte 5 is not printable ASCII"},
        BadInput{"tls_cert_not_pem", {"--tls-cert", "@cert.pem", "--tls-key", "@cert.pem"}, "expected a PEM certificate"},
        BadInput{"tls_cert_without_key", {"--tls-cert", "@cert.pem"}, "needs --tls-key"}),
    [](const auto& info) { return info.param.name; });

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

// torchrun copies the root cause's error file to its own TORCHELASTIC_ERROR_FILE (schedulers read
// it); launch wrote nothing there.
TEST(Launch, OwnErrorFileGetsTheRootCause) {
  TempDir dir;
  const std::string own = dir / "launch_error.json";
  auto r = RunCmd({kLaunch, "--nproc-per-node=2", kWorker, "--fail-rank", "1", "7", "--sleep", "0"},
                  {"TORCHELASTIC_ERROR_FILE=" + own});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_THAT(ReadFile(own), HasSubstr("\"message\":\"rank 1 (local rank 1) on "));
  EXPECT_THAT(ReadFile(own), HasSubstr(": exit 7\""));
  auto with = RunCmd({kLaunch, "--nproc-per-node=2", kWorker, "--exit-if-env", "RANK", "0", "0", "--error-file",
                      "ValueError: bad batch", "--exit", "3"},
                     {"TORCHELASTIC_ERROR_FILE=" + own});
  EXPECT_EQ(with.exit_code, 3) << with.err;
  EXPECT_THAT(ReadFile(own), HasSubstr("\"message\": \"ValueError: bad batch\""));
}

// spdlog reads an unknown level as "off": every later error went silent.
TEST(Launch, BadLogLevelIsAnError) {
  auto r = RunCmd({kLaunch, "--nproc-per-node=1", kWorker}, {"LAUNCH_LOG_LEVEL=bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "launch: LAUNCH_LOG_LEVEL=bogus: expected trace, debug, info, warn, error or off\n");
  auto ok = RunCmd({kLaunch, "--nproc-per-node=1", kWorker}, {"LAUNCH_LOG_LEVEL=error"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(Launch, NprocGpuWithoutGpuIsAClearError) {
  auto probe = RunCmd(Cmd({"--nproc-per-node=gpu", "--dry-run"}, {}));
  if (probe.exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_EQ(probe.exit_code, 2);
  EXPECT_THAT(probe.err, HasSubstr("--nproc-per-node=gpu: no GPU"));
  EXPECT_EQ(Lines(probe.err).size(), 1u) << probe.err;
}

// scripts/gpu_check.sh on a machine without a GPU: exit 2 and one line that says so, its report
// holding the same line, and nothing left in /tmp.
TEST(GpuCheck, RefusesClearlyWithoutAGpu) {
  auto probe = RunCmd(Cmd({"--nproc-per-node=gpu", "--dry-run"}, {}));
  if (probe.exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  auto r = RunCmd({"/bin/bash", std::string(TESTS_DIR) + "/../scripts/gpu_check.sh", dir / "report"},
                  {"GPU_CHECK_LAUNCH=" + kLaunch}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("gpu_check.sh: cannot run here: no GPU: launch: --nproc-per-node=gpu: no GPU ("));
  EXPECT_EQ(Lines(r.out).size(), 1u) << r.out;
  EXPECT_EQ(ReadFile(dir / "report/report.md"), r.out);
  EXPECT_TRUE(std::filesystem::exists(dir / "report/logs.tar.gz"));
}

TEST(Launch, HelpListsTorchrunFlags) {
  auto r = RunCmd({kLaunch, "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* f : {"--nproc-per-node", "--max-restarts", "--rdzv-endpoint", "--redirects", "--tee",
                        "--log-dir", "--stop-timeout", "--gpu-binding", "--dry-run"}) {
    EXPECT_THAT(r.out, HasSubstr(f));
  }
}

}  // namespace
}  // namespace launch::testing
