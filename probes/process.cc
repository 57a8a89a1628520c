#include "probes/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace launch {

namespace {

// Bounds on what a binding names (Linux's own limits are 8192 CPUs and 1024 nodes by default).
constexpr int kMaxCpuId = 1 << 16;
constexpr int kMaxNumaNode = 1 << 12;

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

absl::Status CheckExecutable(const std::string& path, const std::string& program) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("program '", program, "' does not exist"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat("program '", program, "' is not a regular file"));
  }
  if (::access(path.c_str(), X_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("program '", program, "' is not executable (chmod +x, or run a .py script)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ResolveExecutable(const std::string& program, const std::string& path_env) {
  if (program.empty()) return absl::InvalidArgumentError("empty program name");
  if (program.find('/') != std::string::npos) {
    RETURN_IF_ERROR(CheckExecutable(program, program));
    return program;
  }
  for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", program);
    if (CheckExecutable(candidate, program).ok()) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("program '", program, "' was not found on PATH"));
}

namespace {

void FreeCpuSet(cpu_set_t* s) { CPU_FREE(s); }

// Everything the child touches between vfork and exec, made before vfork: the child shares our
// memory until it execs, so it makes only system calls with what is here.
struct ChildPlan {
  std::vector<char*> argv, envp;
  const char* cwd = nullptr;  // nullptr: inherit
  pid_t parent = -1;
  // The CPU set and node mask: the child only hands them to the kernel.
  std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> cpuset{nullptr, FreeCpuSet};
  size_t cpuset_size = 0;
  std::vector<unsigned long> nodemask;
  unsigned long nodemask_bits = 0;
  int status_fd = -1;  // the status pipe's write end, close-on-exec
};

absl::Status PlanCpuSet(const std::vector<int>& cpus, ChildPlan* plan) {
  if (cpus.empty()) return absl::OkStatus();
  const int max_cpu = *std::max_element(cpus.begin(), cpus.end());
  if (cpus.front() < 0 || max_cpu >= kMaxCpuId) return absl::InvalidArgumentError("CPU id out of range");
  plan->cpuset.reset(CPU_ALLOC(max_cpu + 1));
  if (!plan->cpuset) return ErrnoStatus("CPU_ALLOC");
  plan->cpuset_size = CPU_ALLOC_SIZE(max_cpu + 1);
  CPU_ZERO_S(plan->cpuset_size, plan->cpuset.get());
  for (int c : cpus) CPU_SET_S(c, plan->cpuset_size, plan->cpuset.get());
  return absl::OkStatus();
}

absl::Status PlanNodeMask(int node, ChildPlan* plan) {
  if (node >= 0) {
    if (node >= kMaxNumaNode) return absl::InvalidArgumentError("NUMA node out of range");
    constexpr int kBits = 8 * sizeof(unsigned long);
    plan->nodemask.assign(static_cast<size_t>(node / kBits + 1), 0);
    plan->nodemask[node / kBits] |= 1UL << (node % kBits);
  }
  // set_mempolicy reads one bit fewer than it is told (as libnuma passes it).
  plan->nodemask_bits = plan->nodemask.size() * 8 * sizeof(unsigned long) + 1;
  return absl::OkStatus();
}

absl::Status PlanChild(const SpawnOptions& opts, ChildPlan* plan) {
  plan->argv = CStrings(opts.argv);
  plan->envp = CStrings(opts.env);
  plan->cwd = opts.cwd.empty() ? nullptr : opts.cwd.c_str();
  plan->parent = ::getpid();
  if (opts.extra_fd >= 0 && opts.extra_fd_target <= STDERR_FILENO) {
    return absl::InvalidArgumentError("the extra descriptor's target must be above 2");
  }
  RETURN_IF_ERROR(PlanCpuSet(opts.cpus, plan));
  return PlanNodeMask(opts.preferred_memory_node, plan);
}

// The pipe a failed step's errno comes back on; its write end above every number the child gives
// a descriptor, so no dup2 lands on it.
absl::Status MakeStatusPipe(const SpawnOptions& opts, UniqueFd* read, UniqueFd* write) {
  Pipe status;
  if (!MakePipe(&status)) return ErrnoStatus("pipe");
  const int above = std::max(STDERR_FILENO, opts.extra_fd >= 0 ? opts.extra_fd_target : 0) + 1;
  *write = UniqueFd(::fcntl(status.write.get(), F_DUPFD_CLOEXEC, above));
  if (!write->valid()) return ErrnoStatus("fcntl(F_DUPFD_CLOEXEC)");
  *read = std::move(status.read);
  return absl::OkStatus();
}

// ---- The child, between vfork and exec: system calls only, no allocation, no logging ----

// A failed step ends the child with its errno on the status pipe for the parent to report.
[[noreturn]] void FailChild(int status_fd) {
  const int err = errno;
  ssize_t n = ::write(status_fd, &err, sizeof err);
  (void)n;
  ::_exit(127);
}

// "+<pgid>\n" on the orphan guard's pipe, formatted without allocating; one write under PIPE_BUF
// is atomic.
void RegisterWithGuard(int guard_fd, int status_fd) {
  char line[24];
  char digits[16];
  int nd = 0;
  for (unsigned long v = static_cast<unsigned long>(::getpid()); v > 0 || nd == 0; v /= 10) {
    digits[nd++] = static_cast<char>('0' + v % 10);
  }
  int len = 0;
  line[len++] = '+';
  while (nd > 0) line[len++] = digits[--nd];
  line[len++] = '\n';
  if (::write(guard_fd, line, static_cast<size_t>(len)) != len) FailChild(status_fd);
}

// Workers start with default dispositions, except what launch itself was started with ignored
// (nohup's SIGHUP), which exec keeps. SIGPIPE and SIGTTIN launch ignores itself
// (BlockLauncherSignals), so they are reset.
void ResetSignalDispositions() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    struct sigaction cur {};
    if (::sigaction(s, nullptr, &cur) == 0 && cur.sa_handler == SIG_IGN && s != SIGPIPE && s != SIGTTIN) continue;
    ::sigaction(s, &dfl, nullptr);
  }
}

// dup2 onto itself would keep FD_CLOEXEC, so that case clears the flag instead.
void GiveDescriptor(int from, int to, int status_fd) {
  if (from == to) {
    if (::fcntl(to, F_SETFD, 0) != 0) FailChild(status_fd);
  } else if (::dup2(from, to) != to) {
    FailChild(status_fd);
  }
}

void CloseDescriptors(int lo, int hi, int status_fd) {
  if (lo > hi) return;
  if (::close_range(static_cast<unsigned>(lo), static_cast<unsigned>(hi), 0) != 0) {
    if (errno != ENOSYS) FailChild(status_fd);
    for (int fd = lo; fd <= hi && fd < 65536; ++fd) ::close(fd);  // kernels before 5.9
  }
}

// Exactly 0, 1, 2 and the extra descriptor reach the worker (torchrun's workers have 0-2).
// Everything else is closed: the gaps around the extra descriptor and the status pipe (which
// closes itself at exec).
void ArrangeDescriptors(const SpawnOptions& opts, int status_fd) {
  if (opts.stdin_fd >= 0) GiveDescriptor(opts.stdin_fd, STDIN_FILENO, status_fd);
  if (opts.stdout_fd >= 0) GiveDescriptor(opts.stdout_fd, STDOUT_FILENO, status_fd);
  if (opts.stderr_fd >= 0) GiveDescriptor(opts.stderr_fd, STDERR_FILENO, status_fd);
  if (opts.extra_fd >= 0) GiveDescriptor(opts.extra_fd, opts.extra_fd_target, status_fd);
  int next = STDERR_FILENO + 1;
  if (opts.extra_fd >= 0) {
    CloseDescriptors(next, opts.extra_fd_target - 1, status_fd);
    next = opts.extra_fd_target + 1;
  }
  CloseDescriptors(next, status_fd - 1, status_fd);
  CloseDescriptors(status_fd + 1, ~0U >> 1, status_fd);
}

[[noreturn]] void RunChild(const SpawnOptions& opts, const ChildPlan& plan) {
  const int status_fd = plan.status_fd;
  if (opts.controlling_terminal) {
    if (::setsid() < 0) FailChild(status_fd);
  } else if (opts.new_process_group) {
    ::setpgid(0, 0);
  }
  if (opts.guard_fd >= 0 && opts.new_process_group) RegisterWithGuard(opts.guard_fd, status_fd);
  if (opts.parent_death_signal != 0) {
    ::prctl(PR_SET_PDEATHSIG, opts.parent_death_signal);
    if (::getppid() != plan.parent) ::_exit(127);  // the parent died before prctl took effect
  }
  ResetSignalDispositions();
  ArrangeDescriptors(opts, status_fd);
  if (opts.controlling_terminal && ::ioctl(STDIN_FILENO, TIOCSCTTY, 0) != 0) FailChild(status_fd);
  if (plan.cwd && ::chdir(plan.cwd) != 0) FailChild(status_fd);
  if (plan.cpuset && ::sched_setaffinity(0, plan.cpuset_size, plan.cpuset.get()) != 0) FailChild(status_fd);
  if (!plan.nodemask.empty() &&
      ::syscall(SYS_set_mempolicy, MPOL_PREFERRED, plan.nodemask.data(), plan.nodemask_bits) != 0) {
    FailChild(status_fd);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(plan.argv[0], plan.argv.data(), plan.envp.data());
  FailChild(status_fd);
}

// ---- The parent, after vfork ----

// EOF: the exec closed the pipe (0). An errno: the step that failed.
int ReadChildErrno(int status_read) {
  int child_errno = 0;
  for (;;) {
    ssize_t n = ::read(status_read, &child_errno, sizeof child_errno);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof child_errno)) child_errno = 0;
    return child_errno;
  }
}

// The pid once the child exec'd (every copy of the status pipe's write end is closed by then);
// else the child is reaped and the step that failed is the error.
absl::StatusOr<pid_t> AwaitExec(const SpawnOptions& opts, pid_t pid, int status_read) {
  const int child_errno = ReadChildErrno(status_read);
  if (child_errno == 0) return pid;
  int status;
  ::waitpid(pid, &status, 0);
  if (opts.guard_fd >= 0 && opts.new_process_group) {  // it may have registered its group
    const std::string line = absl::StrCat("-", pid, "\n");
    ssize_t ignored = ::write(opts.guard_fd, line.data(), line.size());
    (void)ignored;
  }
  return ErrnoStatus(absl::StrCat("cannot start '", opts.argv[0], "'"), child_errno);
}

}  // namespace

absl::StatusOr<pid_t> PosixProcessLauncher::Spawn(const SpawnOptions& opts) {
  if (opts.argv.empty()) return absl::InvalidArgumentError("empty argv");
  // Everything the child touches is prepared before vfork (ChildPlan). A failed step is reported as
  // its errno on a close-on-exec pipe: EOF means the exec happened. (Not through shared memory:
  // where vfork is a fork, as under ThreadSanitizer, a failed exec looked like a started worker.)
  // (vfork, not fork: copying the page tables of a large threaded process cost ~2 ms per worker.)
  ChildPlan plan;
  RETURN_IF_ERROR(PlanChild(opts, &plan));
  UniqueFd status_read, status_write;
  RETURN_IF_ERROR(MakeStatusPipe(opts, &status_read, &status_write));
  plan.status_fd = status_write.get();
  // Nothing may be delivered to the child between vfork and exec (it runs on our stack): every
  // signal is blocked around vfork, as posix_spawn does, and the parent's mask restored after.
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  pid_t pid = ::vfork();
  if (pid < 0) {
    const int err = errno;
    ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    return ErrnoStatus("vfork", err);
  }
  if (pid == 0) RunChild(opts, plan);
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (opts.new_process_group) ::setpgid(pid, pid);  // harmless if the child did it already
  status_write.Reset();
  return AwaitExec(opts, pid, status_read.get());
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev) return absl::StrCat("SIG", abbrev);
  return absl::StrCat("signal ", sig);
}

void PosixProcessLauncher::SignalGroup(pid_t pgid, int sig) {
  if (pgid > 0) ::kill(-pgid, sig);
}

void PosixProcessLauncher::Signal(pid_t pid, int sig) {
  if (pid > 0) ::kill(pid, sig);
}

bool PosixProcessLauncher::GroupAlive(pid_t pgid) { return pgid > 0 && (::kill(-pgid, 0) == 0 || errno == EPERM); }

std::optional<std::vector<std::string>> PosixProcessLauncher::GroupCommandLines(pid_t pgid) {
  constexpr size_t kMaxProcesses = 64, kMaxCommandLine = 4096;
  std::vector<std::string> lines;
  if (pgid <= 0) return lines;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir("/proc"), ::closedir);
  if (!dir) return std::nullopt;
  while (const dirent* e = ::readdir(dir.get())) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid <= 0) continue;
    // The command name may hold spaces and ')': the fields after its last ')' are
    // state, ppid, pgrp.
    const std::string stat = ReadFileUpTo(absl::StrCat("/proc/", pid, "/stat"), 1024);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ',
                                                           absl::SkipEmpty());
    pid_t group = 0;
    if (fields.size() < 3 || !absl::SimpleAtoi(fields[2], &group) || group != pgid) continue;
    if (fields[0] == "Z" || fields[0] == "X") continue;  // exited, not yet reaped
    std::string cmd = ReadFileUpTo(absl::StrCat("/proc/", pid, "/cmdline"), kMaxCommandLine);
    while (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.empty()) continue;  // exiting: its memory, and so its argv, is already gone
    lines.push_back(std::move(cmd));
    if (lines.size() == kMaxProcesses) break;
  }
  return lines;
}

std::optional<ChildExit> PosixProcessLauncher::ReapAny() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (pid <= 0) return std::nullopt;
  ChildExit e;
  e.pid = pid;
  if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  return e;
}

void PosixProcessLauncher::KillAndReap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(-pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

// ---- OrphanGuard ----

namespace {

// The helper's whole life: async-signal-safe calls on a fixed table, no allocation.
[[noreturn]] void GuardMain(int read_fd) {
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(s, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  constexpr int kMax = 8192;
  static pid_t groups[kMax];
  int count = 0;
  char buf[512];
  char line[32];
  int line_len = 0;
  for (;;) {
    ssize_t n = ::read(read_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\n') {
        if (line_len < static_cast<int>(sizeof line) - 1) line[line_len++] = buf[i];
        continue;
      }
      pid_t pg = 0;
      for (int j = 1; j < line_len; ++j) pg = pg * 10 + (line[j] - '0');
      if (line_len > 1 && line[0] == '+' && count < kMax) {
        groups[count++] = pg;
      } else if (line_len > 1 && line[0] == '-') {
        for (int j = 0; j < count; ++j) {
          if (groups[j] == pg) {
            groups[j] = groups[--count];
            break;
          }
        }
      }
      line_len = 0;
    }
  }
  for (int j = 0; j < count; ++j) ::kill(-groups[j], SIGKILL);
  ::_exit(0);
}

}  // namespace

absl::Status OrphanGuard::Start() {
  Pipe p;
  if (!MakePipe(&p)) return ErrnoStatus("pipe");
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoStatus("fork");
  if (pid == 0) {
    // Only the read end stays open: EOF then means every copy of the write end is gone.
    p.write.Reset();
    // One call where the kernel has close_range (5.9), not a thousand: the helper starts beside
    // the workers' spawn on every launch.
    const unsigned keep = static_cast<unsigned>(p.read.get());
    if ((keep > 3 && ::syscall(SYS_close_range, 3u, keep - 1, 0u) != 0) ||
        ::syscall(SYS_close_range, keep + 1, ~0u, 0u) != 0) {
      for (int fd = 3; fd < 1024; ++fd)
        if (fd != p.read.get()) ::close(fd);
    }
    ::setpgid(0, 0);  // out of the terminal's foreground group: Ctrl-C is launch's to handle
    GuardMain(p.read.get());
  }
  pid_ = pid;
  write_ = std::move(p.write);
  return absl::OkStatus();
}

void OrphanGuard::Send(char op, pid_t pgid) {
  if (!write_.valid()) return;
  std::string msg = absl::StrCat(std::string(1, op), pgid, "\n");
  ssize_t ignored = ::write(write_.get(), msg.data(), msg.size());
  (void)ignored;
}

void OrphanGuard::Remove(pid_t pgid) { Send('-', pgid); }

void OrphanGuard::Stop() {
  write_.Reset();
  if (pid_ > 0) {
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
}

OrphanGuard::~OrphanGuard() { Stop(); }

}  // namespace launch
