#include "probes/signals.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/strings.h"

namespace launch {
namespace {

// The signals --signals-to-handle may name: those whose default action ends a program and that a
// user, a terminal or a scheduler sends to ask it to stop. SIGKILL and SIGSTOP cannot be caught;
// fault signals (SIGSEGV, ...) and SIGCHLD, SIGPIPE are launch's own business.
constexpr int kHandleable[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU};

sigset_t LauncherSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : kHandleable) sigaddset(&set, s);
  return set;
}

std::string Accepted() {
  std::vector<int> all(std::begin(kHandleable), std::end(kHandleable));
  return SignalListName(all);
}

}  // namespace

std::vector<int> DefaultHandledSignals() { return {SIGTERM, SIGINT, SIGHUP, SIGQUIT}; }
std::vector<int> SlurmHandledSignals() { return {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}; }

absl::StatusOr<std::vector<int>> ParseSignalList(const std::string& list) {
  std::vector<int> out;
  for (const std::string& item : SplitCommaList(list)) {
    std::string name = absl::AsciiStrToUpper(item);
    int sig = 0;
    if (!absl::SimpleAtoi(name, &sig)) {
      if (name.rfind("SIG", 0) == 0) name = name.substr(3);
      for (int s : kHandleable) {
        const char* abbrev = sigabbrev_np(s);
        if (abbrev && name == abbrev) sig = s;
      }
    }
    bool ok = false;
    for (int s : kHandleable) ok |= s == sig;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item.substr(0, 32), "': expected signals among ", Accepted()));
    }
    bool seen = false;
    for (int s : out) seen |= s == sig;
    if (!seen) out.push_back(sig);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("expected signals among ", Accepted()));
  return out;
}

std::string SignalListName(const std::vector<int>& signals) {
  std::vector<std::string> names;
  for (int s : signals) {
    const char* abbrev = sigabbrev_np(s);
    names.push_back(abbrev ? absl::StrCat("SIG", abbrev) : std::to_string(s));
  }
  return absl::StrJoin(names, ",");
}

void BlockLauncherSignals() {
  sigset_t set = LauncherSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed console or socket is an error code, not a crash
  // Reading a terminal launch is no longer in the foreground of (Ctrl-Z, then bg) fails with EIO
  // instead of stopping launch, which relays the terminal to rank 0.
  signal(SIGTTIN, SIG_IGN);
}

namespace {

constexpr int kMaxStoppableGroups = 8192;
// A group id, with kOwnSession set for a group that leads its own session (pids are below 2^22).
constexpr pid_t kOwnSession = pid_t{1} << 30;
std::atomic<pid_t> g_stoppable[kMaxStoppableGroups];
std::atomic<uint64_t> g_continued{0};

void ForwardToGroups(int sig) {
  for (auto& g : g_stoppable) {
    const pid_t entry = g.load(std::memory_order_relaxed);
    if (entry <= 0) continue;
    const bool own_session = (entry & kOwnSession) != 0;
    ::kill(-(entry & ~kOwnSession), own_session && sig == SIGTSTP ? SIGSTOP : sig);
  }
}

void OnStop(int) {
  const int saved = errno;
  ForwardToGroups(SIGTSTP);
  // Stop as SIGTSTP's default would (the shell then says "Stopped"): SA_NODEFER leaves it
  // unblocked here, so it is taken at once; the handler is back once launch is continued.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  struct sigaction mine {};
  ::sigaction(SIGTSTP, &dfl, &mine);
  ::raise(SIGTSTP);
  ::sigaction(SIGTSTP, &mine, nullptr);
  errno = saved;
}

void OnContinue(int) {
  const int saved = errno;
  g_continued.fetch_add(1, std::memory_order_relaxed);
  ForwardToGroups(SIGCONT);
  errno = saved;
}

}  // namespace

void InstallJobControl() {
  struct sigaction stop {};
  stop.sa_handler = OnStop;
  sigemptyset(&stop.sa_mask);
  stop.sa_flags = SA_RESTART | SA_NODEFER;
  ::sigaction(SIGTSTP, &stop, nullptr);
  struct sigaction cont {};
  cont.sa_handler = OnContinue;
  sigemptyset(&cont.sa_mask);
  cont.sa_flags = SA_RESTART;
  ::sigaction(SIGCONT, &cont, nullptr);
}

void AddStoppableGroup(pid_t pgid, bool own_session) {
  if (pgid <= 0 || pgid >= kOwnSession) return;
  const pid_t entry = own_session ? pgid | kOwnSession : pgid;
  for (auto& g : g_stoppable) {
    pid_t free = 0;
    if (g.compare_exchange_strong(free, entry)) return;
  }
}

void RemoveStoppableGroup(pid_t pgid) {
  if (pgid <= 0 || pgid >= kOwnSession) return;
  for (auto& g : g_stoppable) {
    pid_t mine = pgid;
    if (g.compare_exchange_strong(mine, 0)) return;
    mine = pgid | kOwnSession;
    if (g.compare_exchange_strong(mine, 0)) return;
  }
}

uint64_t ContinuedCount() { return g_continued.load(std::memory_order_relaxed); }

int SignalFd::Pending() const {
  sigset_t pending;
  sigemptyset(&pending);
  if (sigpending(&pending) != 0) return 0;
  for (int s = 1; s < 64; ++s) {
    if (s != SIGCHLD && (handled_ >> s & 1ULL) && sigismember(&pending, s) == 1) return s;
  }
  return 0;
}

absl::StatusOr<SignalFd> SignalFd::Create(const std::vector<int>& handled) {
  sigset_t set = LauncherSignals();
  unsigned long long mask = 1ULL << SIGCHLD;
  for (int s : handled) {
    if (s > 0 && s < 64 && sigismember(&set, s) == 1) mask |= 1ULL << s;
  }
  int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return ErrnoStatus("signalfd");
  return SignalFd(UniqueFd(fd), mask);
}

int SignalFd::Read() {
  signalfd_siginfo info;
  for (;;) {
    ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n < 0 && errno == EINTR) continue;
    if (n != sizeof info) return 0;
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig < 64 && (handled_ & (1ULL << sig))) return sig;
    // Not handled: its default action, as if launch had never blocked it (it ends launch; the
    // orphan guard then kills the workers).
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
  }
}

}  // namespace launch
