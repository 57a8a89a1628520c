// The console of the real `launch`: whole, prefixed lines, a console that stops reading, unended
// output, the terminal and stdin of rank 0, and which ranks are shown.

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <termios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr long long LineRelayPiece = 64 * 1024;  // LineRelay::kMaxLineBytes

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
  Child c(
      Cmd({"--nproc-per-node=2", "--max-restarts=1", "--stop-timeout=5"},
          {"--spew", "100", "--pid-file", ready, "--wait-lines", ready, "2", "--fail-rank", "1", "3", "--spew", "0"}));
  c.PauseStdout(true);
  const bool ended = WaitUntil(
      [&] {
        c.Pump(20);
        return absl::StrContains(c.err(), "worker group failed after 1 restart");
      },
      std::chrono::seconds(60));
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

// `argv` run on a new pseudo-terminal (of `size`, or the default), as from a shell.
class OnPty {
 public:
  OnPty(std::vector<std::string> argv, const winsize* size = nullptr) {
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_ = ::forkpty(&master_, nullptr, nullptr, size);
    if (pid_ == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
  }
  ~OnPty() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) ::close(master_);
  }
  bool started() const { return pid_ > 0; }
  int master() const { return master_; }
  const std::string& out() const { return out_; }
  // Reads until `needle` has shown (writing `send` before each look), at most 30 s.
  bool ReadUntil(const std::string& needle, const std::string& send = "") {
    return WaitUntil(
        [&] {
          if (!send.empty() && ::write(master_, send.data(), send.size()) < 0) return false;
          pollfd p{master_, POLLIN, 0};
          char buf[4096];
          while (::poll(&p, 1, 10) == 1) {
            ssize_t n = ::read(master_, buf, sizeof buf);
            if (n <= 0) break;
            out_.append(buf, static_cast<size_t>(n));
          }
          return absl::StrContains(out_, needle);
        },
        std::chrono::seconds(30));
  }
  // Whether it exited 0 in time (it is killed otherwise).
  bool ExitedZero() {
    int status = 0;
    reaped_ = WaitUntil([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; });
    return reaped_ && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  int master_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string out_;
};

// With pdb.set_trace() or input(), a worker read the terminal from its own process group and was
// stopped by SIGTTIN: launch hung. Rank 0 now reads the terminal through launch (the prompt is
// shown though it has no newline), the other ranks read /dev/null.
TEST(Launch, RankZeroReadsTheTerminal) {
  OnPty t(Cmd({"--nproc-per-node=2"}, {"--read-line", "name? "}));
  ASSERT_TRUE(t.started());
  EXPECT_TRUE(t.ReadUntil("[0]:name? ")) << t.out();
  EXPECT_TRUE(t.ReadUntil("got EOF")) << t.out();  // rank 1, on its prompt's line or its own
  ASSERT_EQ(::write(t.master(), "hello\n", 6), 6);
  EXPECT_TRUE(t.ReadUntil("[0]:got hello")) << t.out();
  EXPECT_TRUE(t.ExitedZero()) << t.out();
}

// Under a terminal, the rank that reads stdin is on a terminal of its own, as it is on the user's
// under torchrun: isatty() on its stdin, stdout and stderr, the terminal's size, and a new size
// when the terminal's changes; what is typed reaches it. The other rank is not on one.
TEST(Launch, RankZeroGetsATerminalOfTheTerminalsSize) {
  winsize size{};
  size.ws_row = 33;
  size.ws_col = 111;
  OnPty t({kLaunch, "--nproc-per-node=2", "--no-python", "/bin/sh", "-c",
           "for fd in 0 1 2; do test -t $fd && echo \"tty $fd\"; done; echo \"size $(stty size)\"; "
           "[ \"$RANK\" = 0 ] || exit 0; "
           "while read line; do echo \"got $line size $(stty size)\"; "
           "[ \"$line\" = end ] && exit 0; done"},
          &size);
  ASSERT_TRUE(t.started());
  EXPECT_TRUE(t.ReadUntil("[0]:size 33 111")) << t.out();
  EXPECT_TRUE(t.ReadUntil("[1]:size")) << t.out();
  for (const char* line : {"[0]:tty 0", "[0]:tty 1", "[0]:tty 2"}) EXPECT_THAT(t.out(), HasSubstr(line));
  EXPECT_THAT(t.out(), Not(HasSubstr("[1]:tty")));
  EXPECT_TRUE(t.ReadUntil("[0]:got hello size 33 111", "hello\n")) << t.out();
  size.ws_row = 40;
  size.ws_col = 120;
  ASSERT_EQ(::ioctl(t.master(), TIOCSWINSZ, &size), 0);
  // The worker's terminal follows: each line typed is answered with its size until it is new.
  EXPECT_TRUE(t.ReadUntil("size 40 120", "again\n")) << t.out();
  ASSERT_EQ(::write(t.master(), "end\n", 4), 4);
  EXPECT_TRUE(t.ExitedZero()) << t.out();
  // The terminal is launch's again as it was: it echoes and edits lines.
  termios mode{};
  ASSERT_EQ(::tcgetattr(t.master(), &mode), 0);
  EXPECT_NE(mode.c_lflag & ICANON, 0u);
  EXPECT_NE(mode.c_lflag & ECHO, 0u);
}

// The state letter of /proc/PID/stat ('T': stopped), or '?' when it cannot be read.
char ProcessState(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

// Ctrl-Z stopped launch but not its workers (in process groups of their own, which the terminal's
// SIGTSTP does not reach): they kept computing. They stop with launch now, and the shell's SIGCONT
// (fg) to launch resumes them too.
TEST(Launch, CtrlZStopsTheWorkersAndFgResumesThem) {
  TempDir dir;
  std::vector<std::string> argv = Cmd({"--nproc-per-node=2"},
                                      {"--pid-file", dir / "pids", "--wait-lines", dir / "go", "1", "--exit", "0"});
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string launch_pid_file = dir / "launch.pid";
  int master = -1;
  // A shell of the terminal's session runs launch as its foreground job, in a process group of its
  // own (a session leader's group would be orphaned, and the kernel ignores SIGTSTP there).
  const pid_t shell = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(shell, 0);
  if (shell == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const pid_t job = ::fork();
    if (job == 0) {
      ::setpgid(0, 0);
      WriteFile(launch_pid_file, std::to_string(::getpid()) + "\n");
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    ::setpgid(job, job);
    ::tcsetpgrp(STDIN_FILENO, job);
    int st = 0;
    while (::waitpid(job, &st, 0) != job) {
    }
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  std::string out;
  auto pump = [&] {
    pollfd p{master, POLLIN, 0};
    char buf[4096];
    while (::poll(&p, 1, 10) == 1) {
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  };
  std::vector<pid_t> workers;
  pid_t pid = -1;
  EXPECT_TRUE(WaitUntil(
      [&] {
        pump();
        workers = ReadPids(dir / "pids");
        const std::vector<pid_t> launch = ReadPids(launch_pid_file);
        if (!launch.empty()) pid = launch[0];
        return workers.size() == 2 && pid > 0;
      },
      std::chrono::seconds(60)))
      << out;
  if (workers.size() != 2 || pid <= 0) {
    if (pid > 0) ::kill(-pid, SIGKILL);
    ::kill(shell, SIGKILL);
    ::waitpid(shell, nullptr, 0);
    ::close(master);
    FAIL() << "the workers did not start: " << out;
  }
  auto all_in = [&](bool stopped) {
    return WaitUntil(
        [&] {
          pump();
          bool all = (ProcessState(pid) == 'T') == stopped;
          for (pid_t w : workers) all = all && (ProcessState(w) == 'T') == stopped;
          return all;
        },
        std::chrono::seconds(30));
  };
  ASSERT_EQ(::write(master, "\x1a", 1), 1);  // Ctrl-Z: the terminal sends SIGTSTP to launch
  EXPECT_TRUE(all_in(true)) << "launch " << ProcessState(pid) << ", workers " << ProcessState(workers[0])
                            << ProcessState(workers[1]) << "\n"
                            << out;
  ::kill(-pid, SIGCONT);  // fg
  EXPECT_TRUE(all_in(false)) << "launch " << ProcessState(pid) << ", workers " << ProcessState(workers[0])
                             << ProcessState(workers[1]) << "\n"
                             << out;
  ::kill(-pid, SIGCONT);  // whatever happened above: the job must be able to end
  WriteFile(dir / "go", "go\n");
  int status = 0;
  const bool exited = WaitUntil(
      [&] {
        pump();
        return ::waitpid(shell, &status, WNOHANG) == shell;
      },
      std::chrono::seconds(60));
  if (!exited) {
    ::kill(-pid, SIGKILL);
    ::kill(shell, SIGKILL);
    ::waitpid(shell, &status, 0);
  }
  ::close(master);
  EXPECT_TRUE(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
}

// Under `2>&1` (or a terminal) a worker's stdout and stderr lines came out of order (2 of 3 runs):
// two pipes, read as they came. One file for both means one pipe now, in the order written.
TEST(Launch, StdoutAndStderrKeepTheirOrderWhenTheyAreOneFile) {
  TempDir dir;
  WriteFile(dir / "both.sh",
            "#!/bin/sh\ni=0\nwhile [ $i -lt 200 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done\nexit 3\n");
  ASSERT_EQ(::chmod((dir / "both.sh").c_str(), 0755), 0);
  auto r = RunCmd({"/bin/sh", "-c", std::string(kLaunch) + " --nproc-per-node=1 " + dir / "both.sh" + " 2>&1"});
  EXPECT_EQ(r.exit_code, 3) << r.out;
  std::string expected;
  for (int i = 0; i < 200; ++i) expected += "[0]:out" + std::to_string(i) + "\n[0]:err" + std::to_string(i) + "\n";
  std::string got;
  for (const std::string& line : Lines(r.out))
    if (line.rfind("[0]:", 0) == 0) got += line + "\n";
  EXPECT_EQ(got, expected);
  // The failure table still shows the last lines (of its output, stderr's among them).
  EXPECT_THAT(r.out, HasSubstr("err199"));
  // Two files: two pipes, each stream whole in its own.
  auto apart = RunCmd({kLaunch, "--nproc-per-node=1", dir / "both.sh"});
  EXPECT_EQ(apart.exit_code, 3);
  EXPECT_THAT(apart.out, HasSubstr("[0]:out199\n"));
  EXPECT_THAT(apart.out, Not(HasSubstr("err5\n")));
  EXPECT_THAT(apart.err, HasSubstr("[0]:err199\n"));
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

TEST(Launch, LocalRanksFilterLimitsTheConsoleOnly) {
  TempDir dir;
  auto r = RunCmd(Cmd({"--nproc-per-node=2", "--local-ranks-filter=1", "--log-dir", dir.path(), "--rdzv-id", "f"},
                      {"--print-env", "RANK"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("[0]:")));
  EXPECT_THAT(r.out, HasSubstr("[1]:RANK=1"));
  EXPECT_EQ(ReadFile(dir.path() + "/f/attempt_0/0/stdout.log"), "RANK=0\n");
}

// torchrun's --log-line-prefix-template, and the default that tells nodes apart on several.
TEST(Launch, LogLinePrefixTemplateAndTheMultiNodeDefault) {
  auto r = RunCmd(
      Cmd({"--nproc-per-node=2", "--role=trainer", "--log-line-prefix-template=<${role_name}:${local_rank}> "},
          {"--print-env", "RANK"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("<trainer:0> RANK=0\n"));
  EXPECT_THAT(r.out, HasSubstr("<trainer:1> RANK=1\n"));
  auto env = RunCmd(Cmd({}, {"--print-env", "RANK"}), {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=${rank}|"});
  ASSERT_EQ(env.exit_code, 0) << env.err;
  EXPECT_THAT(env.out, HasSubstr("0|RANK=0\n"));
  // An empty template is no prefix (it was the default one).
  auto none = RunCmd(Cmd({"--nproc-per-node=2", "--log-line-prefix-template="}, {"--print-env", "RANK"}));
  ASSERT_EQ(none.exit_code, 0) << none.err;
  EXPECT_THAT(none.out, HasSubstr("RANK=0\n"));
  EXPECT_THAT(none.out, Not(HasSubstr("]:")));
  auto bad = RunCmd(Cmd({"--log-line-prefix-template=${gpu}"}, {}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--log-line-prefix-template=${gpu}: '${gpu}' is unknown"));
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  auto static_node = RunCmd(Cmd({"--rdzv-backend=static", "--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1"},
                                {"--print-env", "RANK"}));
  ASSERT_EQ(static_node.exit_code, 0) << static_node.err;
  EXPECT_THAT(static_node.out, HasSubstr(std::string("[") + host + ":1]:RANK=1\n"));
}

}  // namespace
}  // namespace launch::testing
