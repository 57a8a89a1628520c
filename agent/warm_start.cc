#include "agent/warm_start.h"

#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "agent/monitor.h"
#include "common/status_macros.h"
#include "launch_sdk/contract.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {

constexpr char kBootstrap[] = "import _launch_standby; _launch_standby.main()";
// LAUNCH_SDK_WARM_START()'s mark (launch_sdk/warm_start.h), backwards; and the largest file searched.
constexpr char kMarkBackwards[] = "1/trats-mraw-kds-hcnual";
constexpr off_t kMaxMarkedExecutable = off_t{4} << 30;
constexpr idtype_t kPidfdIdType = static_cast<idtype_t>(3);  // P_PIDFD (Linux 5.4), not in every libc

const std::set<std::string>& RoundVariables() {
  static const auto* vars = new std::set<std::string>{
      "RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR",
      "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
      launch_sdk::kLogDirEnv, launch_sdk::kStackFileEnv, launch_sdk::kRoundEnv, launch_sdk::kLrEnv,
      launch_sdk::kLrScaleEnv, launch_sdk::kPerWorkerBatchEnv, launch_sdk::kGlobalBatchEnv,
      // In the attempt's log directory; torch reads them when a process group is made.
      "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"};
  return *vars;
}

Env ToEnv(const std::vector<std::string>& env) {
  Env out;
  for (const auto& kv : env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

// The first variable whose value differs between the two (set in only one counts).
std::string FirstDifference(const Env& a, const Env& b) {
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second != v) return k;
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) return k;
  return "";
}

bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

// One line from `fd` within `timeout_ms`, without its newline, read a byte at a time (what follows
// it is not consumed); nullopt at the end (then `*ended` is set, when given), an error, the
// timeout, or more than `max` bytes.
std::optional<std::string> ReadLine(int fd, int timeout_ms, size_t max, bool* ended = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string line;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    if (!Readable(fd, static_cast<int>(left.count()))) continue;  // EINTR, or the deadline: checked above
    char c = 0;
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0 && ended) *ended = true;
    if (n != 1) return std::nullopt;
    if (c == '\n') return line;
    if (line.size() >= max) return std::nullopt;
    line.push_back(c);
  }
}

// The last line `fd` (a file from its start) ends with, at most 200 bytes of it; "" if none.
std::string LastLine(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size <= 0) return "";
  const off_t from = std::max<off_t>(0, st.st_size - 4096);
  std::string text(static_cast<size_t>(st.st_size - from), '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), from);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  text = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  for (char& c : text)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return text;
}

// The parent of process `pid` (from /proc), -1 if unknown.
pid_t ParentOf(pid_t pid) {
  auto text = ReadProcFile(absl::StrCat("/proc/", pid, "/stat"));
  auto st = text ? ParseProcStat(*text) : std::nullopt;
  return st ? st->ppid : -1;
}

}  // namespace

std::string StandbyEndedAtItsGo(const std::string& said) {
  if (said.empty()) return "its standby ended without starting the worker";
  std::string why = absl::StrCat("its standby ended without starting the worker: ", said);
  // What a standby of contract version 1 says of any later version's go.
  if (absl::StrContains(said, "a malformed go from the agent")) {
    absl::StrAppend(&why, " (a standby older than launch's worker contract version ", launch_sdk::kContractVersion,
                    ": install launch and launch-sdk (or launch's Python modules) of one release)");
  }
  return why;
}

bool IsRoundVariable(const std::string& key) { return RoundVariables().count(key) > 0; }

Env StandbyEnv(const std::vector<std::string>& env) {
  Env out = ToEnv(env);
  for (auto it = out.begin(); it != out.end();) it = IsRoundVariable(it->first) ? out.erase(it) : std::next(it);
  return out;
}

bool DeclaresWarmStart(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      st.st_size > kMaxMarkedExecutable) {
    return false;
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) return false;
  // The mark, with its NUL, as LAUNCH_SDK_WARM_START() defines it; spelled backwards here so that
  // launch's own file never holds it.
  std::string mark(kMarkBackwards, sizeof kMarkBackwards - 1);
  std::reverse(mark.begin(), mark.end());
  mark.push_back('\0');
  const bool found = ::memmem(map, static_cast<size_t>(st.st_size), mark.data(), mark.size()) != nullptr;
  ::munmap(map, static_cast<size_t>(st.st_size));
  return found;
}

absl::StatusOr<std::vector<std::string>> StandbyArgv(const std::vector<std::string>& cold, bool python) {
  if (cold.empty()) return absl::InvalidArgumentError("the worker has no command");
  if (!python) {
    if (DeclaresWarmStart(cold[0])) return cold;
    return absl::InvalidArgumentError(
        absl::StrCat("'", cold[0],
                     "' is neither a Python worker nor a worker_sdk program that declares LAUNCH_SDK_WARM_START()"));
  }
  if (cold.size() < 3 || cold[1] != "-u" || (cold[2] == "-m" && cold.size() < 4)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::StrJoin(cold.begin(), cold.begin() + std::min<size_t>(cold.size(), 3), " "),
                     "' is not a Python worker (expected python -u SCRIPT or -m MODULE)"));
  }
  std::vector<std::string> argv = {cold[0], "-u", "-c", kBootstrap};
  argv.insert(argv.end(), cold.begin() + 2, cold.end());
  return argv;
}

bool WarmStart::stays() const {
  int subreaper = 0;
  return opts_.python && ::prctl(PR_GET_CHILD_SUBREAPER, &subreaper) == 0 && subreaper != 0;
}

WarmStart::~WarmStart() {
  for (auto& [rank, s] : standbys_) Discard(s);
}

void WarmStart::Prepare(const std::vector<WorkerLaunch>& launches) {
  auto cold = [this](const std::string& why) {
    if (!told_cold_) spdlog::info("warm start: {}; the workers start cold", why);
    told_cold_ = true;
  };
  if (opts_.python &&
      (opts_.python_dir.empty() || ::access((opts_.python_dir + "/_launch_standby.py").c_str(), R_OK) != 0)) {
    cold(absl::StrCat("launch's Python module _launch_standby is not in '", opts_.python_dir, "'"));
    return;
  }
  if (no_more_standbys_) return;  // said at the rank's cold start; it would fail the same way again
  const bool may_fork = stays();
  for (const WorkerLaunch& w : launches) {
    if (standbys_.count(w.local_rank)) continue;
    auto argv = StandbyArgv(w.argv, opts_.python);
    if (!argv.ok()) {
      cold(std::string(argv.status().message()));
      return;
    }
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      cold(absl::StrCat("socketpair: ", std::strerror(errno)));
      return;
    }
    UniqueFd mine(sv[0]), theirs(sv[1]);
    // What it prints while it imports: replayed into each worker's stdout and stderr.
    UniqueFd out(::memfd_create("launch-standby-stdout", MFD_CLOEXEC));
    UniqueFd err(::memfd_create("launch-standby-stderr", MFD_CLOEXEC));
    UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!out.valid() || !err.valid() || !dev_null.valid()) {
      cold(absl::StrCat("memfd_create: ", std::strerror(errno)));
      return;
    }
    Standby s;
    s.cold_argv = w.argv;
    s.env = StandbyEnv(w.env);
    s.cpus = w.cpus;
    s.memory_node = w.memory_node;
    Env env = s.env;
    env[launch_sdk::kStandbyFdEnv] = std::to_string(launch_sdk::kStandbyControlFd);
    if (opts_.python) env[launch_sdk::kStandbyImportsEnv] = absl::StrJoin(opts_.imports, ",");
    if (may_fork) env[launch_sdk::kStandbyForkEnv] = "1";
    SpawnOptions so;
    so.argv = *argv;
    so.env = EnvToStrings(env);
    so.stdin_fd = dev_null.get();
    so.stdout_fd = out.get();
    so.stderr_fd = err.get();
    so.extra_fd = theirs.get();
    so.extra_fd_target = launch_sdk::kStandbyControlFd;
    so.guard_fd = opts_.guard_fd;
    so.cpus = w.cpus;
    so.preferred_memory_node = w.memory_node;
    auto pid = launcher_->Spawn(so);
    if (!pid.ok()) {
      cold(absl::StrCat("cannot start a standby: ", pid.status().message()));
      return;
    }
    s.pid = *pid;
#ifdef SYS_pidfd_open
    s.pidfd.Reset(static_cast<int>(::syscall(SYS_pidfd_open, *pid, 0)));
    if (s.pidfd.valid()) ::fcntl(s.pidfd.get(), F_SETFD, FD_CLOEXEC);
#endif
    s.control = std::move(mine);
    s.err = std::move(err);
    standbys_[w.local_rank] = std::move(s);
    ++started_;
  }
}

std::string WarmStart::Ready(Standby& s, const WorkerLaunch& w) {
  if (s.cold_argv != w.argv) return "its command is not the one its standby was made for";
  const Env env = StandbyEnv(w.env);
  if (std::string k = FirstDifference(s.env, env); !k.empty()) {
    return absl::StrCat("its environment changed since its standby started (", k, ")");
  }
  if (s.cpus != w.cpus || s.memory_node != w.memory_node) return "its CPU binding changed";
  if (s.ready) return "";  // it serves one go after another
  const auto deadline = std::chrono::steady_clock::now() + opts_.ready_timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                            std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::StrCat("its standby was not ready within ", opts_.ready_timeout.count() / 1000, " s");
    }
    // The signal fd is left for the agent to read. A pending SIGCHLD alone (a worker or a standby
    // exited; the agent reaps it later) does not stop the wait, which then polls in short steps.
    bool only_sigchld = false;
    if (opts_.signal_fd >= 0 && Readable(opts_.signal_fd, 0)) {
      sigset_t pending;
      sigemptyset(&pending);
      ::sigpending(&pending);
      sigdelset(&pending, SIGCHLD);
      if (!sigisemptyset(&pending)) return "a signal came while its standby got ready";
      only_sigchld = true;
    }
    pollfd p[2] = {{s.control.get(), POLLIN, 0}, {opts_.signal_fd, POLLIN, 0}};
    const int n = ::poll(p, opts_.signal_fd >= 0 && !only_sigchld ? 2 : 1,
                         static_cast<int>(std::min<int64_t>(left.count(), only_sigchld ? 20 : 1000)));
    if (n < 0 && errno != EINTR) return absl::StrCat("poll: ", std::strerror(errno));
    if (p[0].revents) break;
  }
  char c = 0;
  ssize_t r;
  while ((r = ::read(s.control.get(), &c, 1)) < 0 && errno == EINTR) {
  }
  if (r == 1 && c == launch_sdk::kStandbyReady) {
    s.ready = true;
    return "";
  }
  if (r == 1 && c == launch_sdk::kStandbyFailed) {
    // "F<why>\n", then it exits.
    const std::string why = ReadLine(s.control.get(), 2000, 4096).value_or("");
    no_more_standbys_ = true;
    return absl::StrCat("its standby ", why.empty() ? std::string("failed") : why);
  }
  const std::string said = LastLine(s.err.get());
  return absl::StrCat("its standby exited before it was ready", said.empty() ? "" : ": ", said);
}

absl::Status WarmStart::SendGo(Standby& s, const WorkerLaunch& w, const WorkerFds& wf) {
  const std::string msg = launch_sdk::EncodeGo(w.env);
  // The guard's pipe, when there is one: a forked worker registers its process group on it.
  int fds[5] = {wf.progress, wf.in, wf.out, wf.err, opts_.guard_fd};
  const size_t nfds = opts_.guard_fd >= 0 ? 5 : 4;
  char control[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{const_cast<char*>(msg.data()), msg.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
  std::memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
  ::fcntl(s.control.get(), F_SETFL, O_NONBLOCK);
  size_t sent = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sent < msg.size()) {
    ssize_t n;
    if (sent == 0) {
      n = ::sendmsg(s.control.get(), &mh, MSG_NOSIGNAL);
    } else {
      n = ::send(s.control.get(), msg.data() + sent, msg.size() - sent, MSG_NOSIGNAL);
    }
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN && std::chrono::steady_clock::now() < deadline) {
      pollfd p{s.control.get(), POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat("cannot hand its standby the environment: ", n < 0 ? std::strerror(errno) : "it took nothing"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<pid_t, bool>> WarmStart::Started(Standby& s) {
  // "P<pid>\n": the worker's pid, within 10 s (a fork takes milliseconds). Or "F<why>\n" from a
  // standby that cannot serve the go (one of another contract version), which then exits.
  constexpr int kTimeoutMs = 10000;
  bool ended = false;
  auto line = ReadLine(s.control.get(), kTimeoutMs, 4096, &ended);
  if (!line) {
    if (!ended) return absl::UnavailableError("its standby did not say which process is the worker");
    return absl::UnavailableError(StandbyEndedAtItsGo(LastLine(s.err.get())));
  }
  if (!line->empty() && (*line)[0] == launch_sdk::kStandbyFailed) {
    no_more_standbys_ = true;  // every standby of this run would refuse the same way
    return absl::FailedPreconditionError(absl::StrCat("its standby refused the go: ", line->substr(1)));
  }
  pid_t pid = 0;
  if (line->size() < 2 || (*line)[0] != launch_sdk::kStandbyPid ||
      !absl::SimpleAtoi(absl::string_view(*line).substr(1), &pid) || pid <= 1) {
    return absl::DataLossError(absl::StrCat("its standby said '", absl::CEscape(*line), "', not a pid"));
  }
  if (pid == s.pid) return std::make_pair(pid, false);
  // A fork: "D\n" once the process between them has exited and the worker is launch's child.
  const bool done = ReadLine(s.control.get(), kTimeoutMs, 1) == std::string(1, launch_sdk::kStandbyForked);
  const pid_t parent = ParentOf(pid);
  if (done && parent == ::getpid()) return std::make_pair(pid, true);
  // It never became launch's: it cannot be watched, so it does not run (it waits for the middle
  // process's word before it runs anything, and is registered with the guard by then).
  if (parent == s.pid || parent == ::getpid()) ::kill(pid, SIGKILL);
  if (guard_) guard_->Remove(pid);
  return absl::UnavailableError(absl::StrCat("the worker its standby forked (pid ", pid, ") did not become launch's"));
}

void WarmStart::StartsCold(std::map<int, Standby>::iterator it, const WorkerLaunch& w, const std::string& why,
                           bool warn) {
  if (warn) {
    spdlog::warn("rank {} (local rank {}) starts cold: {}", w.rank, w.local_rank, why);
  } else {
    spdlog::info("rank {} (local rank {}) starts cold: {}", w.rank, w.local_rank, why);
  }
  Discard(it->second);
  standbys_.erase(it);
}

bool WarmStart::Send(const WorkerLaunch& w, const WorkerFds& fds) {
  auto it = standbys_.find(w.local_rank);
  if (it == standbys_.end()) return false;
  Standby& s = it->second;
  std::string why = Ready(s, w);
  if (why.empty()) {
    if (auto st = SendGo(s, w, fds); !st.ok()) why = std::string(st.message());
  }
  if (!why.empty()) {
    StartsCold(it, w, why);
    return false;
  }
  s.sent = true;
  return true;
}

std::optional<pid_t> WarmStart::Take(const WorkerLaunch& w) {
  auto it = standbys_.find(w.local_rank);
  if (it == standbys_.end() || !it->second.sent) return std::nullopt;
  Standby& s = it->second;
  s.sent = false;
  absl::StatusOr<std::pair<pid_t, bool>> started = Started(s);
  if (!started.ok()) {
    // A refused go is a skew the user has to mend: said as a warning.
    StartsCold(it, w, std::string(started.status().message()), absl::IsFailedPrecondition(started.status()));
    return std::nullopt;
  }
  ++taken_;
  const auto [pid, forked] = *started;
  if (forked) {
    ++forked_;  // the standby stays for the next attempt
  } else {
    standbys_.erase(it);  // it is the worker now (still registered with the guard, as workers are)
  }
  return pid;
}

void WarmStart::Discard(Standby& s) {
  if (s.pid <= 0) return;
  bool gone = false;
  if (s.pidfd.valid()) gone = Readable(s.pidfd.get(), 0);
  if (!gone) {
    launcher_->KillAndReap(s.pid);
  } else {
    // Its zombie, unless something reaped it already (waitid by pidfd: never another process).
    siginfo_t info{};
    ::waitid(kPidfdIdType, static_cast<id_t>(s.pidfd.get()), &info, WEXITED | WNOHANG);
  }
  if (guard_) guard_->Remove(s.pid);
  s.pid = -1;
}

}  // namespace launch
