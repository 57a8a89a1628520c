#include "agent/worker_group.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/error_file.h"
#include "agent/log_relay.h"
#include "agent/worker_env.h"
#include "common/status_macros.h"
#include "launch_sdk/progress.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {

struct Slot {
  const WorkerLaunch* launch = nullptr;
  pid_t pid = -1;
  bool reaped = false;
  bool group_gone = false;
  bool unregistered = false;  // removed from the orphan guard
  Clock::TimePoint start{};
  UniqueFd out_read, err_read, out_file, err_file;
  std::unique_ptr<LineRelay> out, err;
  ConsoleStream* out_console = nullptr;  // where each stream is shown (nullptr: not shown)
  ConsoleStream* err_console = nullptr;
  bool out_reading = true, err_reading = true;  // in the epoll set for reading
  WorkerResult result;
  // Progress: when the last report came, and the latest step times (for the median).
  std::optional<Clock::TimePoint> last_progress;
  std::deque<double> step_seconds;
  int stack_signal = 0;  // the worker dumps its own stacks on this signal (StackDumpRecord)
};

constexpr size_t kStepTimesKept = 101;

double Median(std::deque<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Owns the started workers for the whole of Run: on any early return (an error) each started
// worker's group is SIGKILLed, the worker reaped and its group removed from the orphan guard, so
// no worker, zombie or stale guard entry (which could later SIGKILL a reused group id) is left.
class StartedWorkers {
 public:
  StartedWorkers(std::vector<Slot>* slots, ProcessLauncher* launcher, OrphanGuard* guard)
      : slots_(slots), launcher_(launcher), guard_(guard) {}
  StartedWorkers(const StartedWorkers&) = delete;
  StartedWorkers& operator=(const StartedWorkers&) = delete;
  ~StartedWorkers() {
    for (Slot& s : *slots_) {
      if (s.pid <= 0) continue;
      if (!s.reaped) {
        launcher_->KillAndReap(s.pid);
        s.reaped = true;
      }
      Unregister(s);
    }
  }
  void Unregister(Slot& s) {
    if (guard_ && s.pid > 0 && !s.unregistered) guard_->Remove(s.pid);
    s.unregistered = true;
  }

 private:
  std::vector<Slot>* slots_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
};

// The stacks of a hung group, captured before it is stopped. A worker that dumps its own
// (StackDumpRecord: the Python module, through faulthandler) gets its signal and is done once its
// file has stopped growing; any other gets the debugger (gdb -batch -p PID -ex "thread apply all
// bt") writing its native stacks to its file.
class StackCaptures {
 public:
  void Start(std::vector<Slot>& slots, ProcessLauncher* launcher, const std::string& debugger) {
    UniqueFd dev_null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    bool needed_debugger = false;
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      if (s.pid <= 0 || s.reaped) continue;
      if (s.stack_signal > 0 && !s.launch->python_stack_file.empty()) {
        launcher->Signal(s.pid, s.stack_signal);
        dumping_[i] = Dump{s.launch->python_stack_file, -1};
        continue;
      }
      if (s.launch->native_stack_file.empty()) continue;
      if (debugger.empty()) {
        needed_debugger = true;
        continue;
      }
      UniqueFd out(::open(s.launch->native_stack_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (!out.valid()) {
        spdlog::warn("cannot write {}: {}", s.launch->native_stack_file, std::strerror(errno));
        continue;
      }
      SpawnOptions so;
      so.argv = {debugger, "-batch", "-nx", "-p", std::to_string(s.pid), "-ex", "thread apply all bt"};
      so.env = {"LC_ALL=C", "PATH=/usr/local/bin:/usr/bin:/bin"};
      so.stdin_fd = dev_null.get();
      so.stdout_fd = out.get();
      so.stderr_fd = out.get();
      auto pid = launcher->Spawn(so);
      if (!pid.ok()) {
        spdlog::warn("cannot capture the stacks of rank {}: {}", s.result.rank, std::string(pid.status().message()));
        continue;
      }
      debuggers_[*pid] = i;
    }
    if (needed_debugger) {
      spdlog::warn("no gdb on PATH: the native stacks of hung workers are not captured (apt-get install gdb)");
    }
  }
  // A child ended: true if it was one of the debuggers.
  bool Reaped(pid_t pid) { return debuggers_.erase(pid) > 0; }
  // Looks at the files of the workers that dump their own stacks: a file that is not empty and
  // has not grown since the last look is complete.
  void Poll() {
    for (auto it = dumping_.begin(); it != dumping_.end();) {
      struct stat st {};
      const off_t size = ::stat(it->second.path.c_str(), &st) == 0 ? st.st_size : 0;
      if (size > 0 && size == it->second.last_size) {
        it = dumping_.erase(it);
      } else {
        it->second.last_size = size;
        ++it;
      }
    }
  }
  bool polling() const { return !dumping_.empty(); }
  bool done() const { return debuggers_.empty() && dumping_.empty(); }
  // Debuggers still running when the group is over (the capture timed out): killed and reaped.
  void KillLeft(ProcessLauncher* launcher) {
    for (const auto& [pid, slot] : debuggers_) launcher->KillAndReap(pid);
    debuggers_.clear();
    dumping_.clear();
  }

 private:
  struct Dump {
    std::string path;
    off_t last_size = -1;
  };
  std::map<pid_t, size_t> debuggers_;  // debugger pid -> slot
  std::map<size_t, Dump> dumping_;     // slot -> its own dump
};

}  // namespace

std::vector<std::string> MainThreadFrames(const std::string& text) {
  std::vector<std::string> frames;
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (absl::StrContains(text, "(most recent call first)")) {
    // faulthandler: "Current thread 0x... (most recent call first):" (the one that took the
    // signal), else the first thread; frames are '  File "/path/x.py", line 12 in func'.
    const bool has_current = absl::StrContains(text, "\nCurrent thread ") || absl::StartsWith(text, "Current thread ");
    bool in = false, seen = false;
    for (const std::string& line : lines) {
      if (absl::StartsWith(line, "Current thread ") || (!has_current && absl::StartsWith(line, "Thread "))) {
        if (seen) break;
        in = seen = true;
        continue;
      }
      if (!in) continue;
      if (!absl::StartsWith(line, "  File \"")) {
        if (!frames.empty()) break;
        continue;
      }
      const size_t q = line.find('"', 8);
      const size_t at = q == std::string::npos ? q : line.find(", line ", q);
      const size_t fn = at == std::string::npos ? at : line.find(" in ", at);
      if (fn == std::string::npos) continue;
      std::string file = line.substr(8, q - 8);
      file = file.substr(file.rfind('/') + 1);
      frames.push_back(absl::StrCat(line.substr(fn + 4), " (", file, ":", line.substr(at + 7, fn - at - 7), ")"));
    }
    return frames;
  }
  // gdb: the main thread is "Thread 1 "; frames are
  // "#2  0x00007f... in std::this_thread::sleep_for<...> (__rtime=...) at /usr/include/...:371".
  bool in = false;
  for (const std::string& line : lines) {
    if (absl::StartsWith(line, "Thread 1 ")) {
      in = true;
      continue;
    }
    if (!in) continue;
    if (!absl::StartsWith(line, "#")) {
      if (!frames.empty()) break;
      continue;
    }
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    std::string f(absl::StripLeadingAsciiWhitespace(line.substr(space)));
    if (absl::StartsWith(f, "0x")) {
      const size_t in_pos = f.find(" in ");
      if (in_pos != std::string::npos) f = f.substr(in_pos + 4);
    }
    std::string name = f.substr(0, f.find(" ("));
    const size_t at = f.rfind(" at ");
    const size_t from = f.rfind(" from ");
    if (at != std::string::npos) {
      std::string where = f.substr(at + 4);
      name = absl::StrCat(name, " (", where.substr(where.rfind('/') + 1), ")");
    } else if (from != std::string::npos) {
      std::string lib = f.substr(from + 6);
      name = absl::StrCat(name, " (", lib.substr(lib.rfind('/') + 1), ")");
    }
    frames.push_back(name);
  }
  return frames;
}

bool WaitsInCollective(const std::vector<std::string>& frames) {
  // Collectives, process groups and data-parallel wrappers (whose Finish or backward hook waits
  // for the bucket allreduces).
  static const char* kMarks[] = {"allreduce", "all_reduce", "broadcast", "barrier", "allgather", "all_gather",
                                 "reduce_scatter", "alltoall", "processgroup", "c10d", "gloo", "nccl",
                                 "distributeddataparallel", "(ddp.cc:", "reducer", "(distributed.py:"};
  for (const std::string& f : frames) {
    const std::string lower = absl::AsciiStrToLower(f);
    for (const char* m : kMarks)
      if (absl::StrContains(lower, m)) return true;
  }
  return false;
}

std::vector<std::string> TopFrames(const std::vector<std::string>& frames, size_t n) {
  std::vector<std::string> top;
  for (size_t i = 0; i < frames.size() && top.size() < n; ++i) {
    const std::string& f = frames[i];
    // Program sources, not library templates in headers.
    const bool located = absl::StrContains(f, ".cc:") || absl::StrContains(f, ".cpp:") ||
                         absl::StrContains(f, ".cxx:") || absl::StrContains(f, ".cu:") || absl::StrContains(f, ".py:");
    if (i == 0 || located) top.push_back(f);
  }
  return top;
}

namespace {

// A worker's stack file as frames: its own Python dump when it made one, else the debugger's.
std::vector<std::string> WorkerFrames(const WorkerLaunch& l) {
  for (const std::string* path : {&l.python_stack_file, &l.native_stack_file}) {
    if (path->empty()) continue;
    std::ifstream in(*path);
    std::stringstream text;
    text << in.rdbuf();
    std::vector<std::string> frames = MainThreadFrames(text.str());
    if (!frames.empty()) return frames;
  }
  return {};
}

// What an epoll event is for: encoded in data.u64.
constexpr uint64_t kSignalTag = 1ull << 40;
constexpr uint64_t kStopTimerTag = 2ull << 40;
constexpr uint64_t kCoordinatorTag = 3ull << 40;
constexpr uint64_t kProgressTag = 4ull << 40;
constexpr uint64_t kConsoleTag = 5ull << 40;
constexpr uint64_t kStdinTag = 6ull << 40;
constexpr uint64_t kStdinPipeTag = 7ull << 40;
constexpr uint64_t kExitTag = 8ull << 40;
constexpr uint64_t kHangTimerTag = 9ull << 40;
constexpr uint64_t kSteppingTimerTag = 10ull << 40;
constexpr uint64_t kExitNoticeTag = 11ull << 40;
constexpr uint64_t kStderrBit = 1ull << 32;

absl::StatusOr<UniqueFd> OpenLog(const std::string& path) {
  if (path.empty()) return UniqueFd();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(absl::StrCat("cannot open log file ", path));
  return UniqueFd(fd);
}

void ArmTimer(int fd, std::chrono::milliseconds after, bool periodic) {
  itimerspec spec{};
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(after).count();
  if (ns <= 0) ns = 1;  // 0 would disarm
  spec.it_value.tv_sec = ns / 1000000000;
  spec.it_value.tv_nsec = ns % 1000000000;
  if (periodic) spec.it_interval = spec.it_value;
  ::timerfd_settime(fd, 0, &spec, nullptr);
}

void DrainTimer(int fd) {
  uint64_t expirations;
  ssize_t n = ::read(fd, &expirations, sizeof expirations);
  (void)n;
}

// A terminal on launch's stdin, relayed to the worker that reads stdin through a pipe: launch is
// in the terminal's foreground group, the workers are not (each leads its own group).
struct StdinRelay {
  UniqueFd tty;        // a description of our own (non-blocking without touching the shell's)
  UniqueFd to_worker;  // the pipe's write end, non-blocking
  std::string pending;  // read from the terminal, not yet taken by the worker
  bool reading = false;  // the terminal is in the epoll set
  bool writing = false;  // the pipe is in the epoll set (the worker has not taken everything)
  bool done = false;     // EOF, or the worker closed its end
};

// Hands the worker what the terminal gave, as far as its pipe takes it.
void FlushStdinRelay(StdinRelay* r) {
  while (r->to_worker.valid() && !r->pending.empty()) {
    ssize_t w = ::write(r->to_worker.get(), r->pending.data(), r->pending.size());
    if (w > 0) {
      r->pending.erase(0, static_cast<size_t>(w));
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;  // the worker reads later: wait for EPOLLOUT
    r->pending.clear();  // EPIPE: the worker closed its stdin or is gone
    r->done = true;
  }
  if (r->done && r->pending.empty()) r->to_worker.Reset();  // the worker reads EOF
}

// The terminal is read while the worker's pipe is open and not backed up; the pipe is watched
// while it holds back what the worker has not read.
void UpdateStdinRelay(int ep, StdinRelay* r) {
  if (!r->tty.valid()) return;
  auto set = [ep](int fd, uint32_t events, uint64_t tag, bool want, bool* in_set) {
    if (want == *in_set) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    ::epoll_ctl(ep, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &ev);
    *in_set = want;
  };
  if (!r->to_worker.valid()) r->writing = false;  // closing it took it out of the set
  set(r->tty.get(), EPOLLIN, kStdinTag, r->to_worker.valid() && !r->done && r->pending.size() < 65536,
      &r->reading);
  if (r->to_worker.valid()) {
    set(r->to_worker.get(), EPOLLOUT, kStdinPipeTag, !r->pending.empty(), &r->writing);
  }
}

}  // namespace

absl::StatusOr<GroupOutcome> WorkerGroup::Run(const std::vector<WorkerLaunch>& launches) {
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep.valid()) return ErrnoStatus("epoll_create1");
  UniqueFd stop_timer(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!stop_timer.valid()) return ErrnoStatus("timerfd_create");
  auto watch = [&](int fd, uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, fd, &ev);
  };
  watch(signals_->fd(), kSignalTag);
  watch(stop_timer.get(), kStopTimerTag);
  // Hang checks: every second, or a quarter of an explicit timeout under 4 s.
  const bool hang_checks = !opts_.hang.timeout || opts_.hang.timeout->count() > 0;
  UniqueFd hang_timer;
  if (hang_checks) {
    hang_timer.Reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    if (!hang_timer.valid()) return ErrnoStatus("timerfd_create");
    std::chrono::milliseconds period(1000);
    if (opts_.hang.timeout) period = std::clamp(*opts_.hang.timeout / 4, std::chrono::milliseconds(10), period);
    ArmTimer(hang_timer.get(), period, true);
    watch(hang_timer.get(), kHangTimerTag);
  }
  if (opts_.stop_fd >= 0) watch(opts_.stop_fd, kCoordinatorTag);
  // Watched from each worker's start, until the group ends however it ends.
  struct ClearNotices {
    ExitNotices* notices;
    ~ClearNotices() {
      if (notices) notices->Clear();
    }
  } clear_notices{opts_.exit_notices};
  if (opts_.exit_notices) watch(opts_.exit_notices->fd(), kExitNoticeTag);

  // One datagram socket for every worker's progress reports (worker_sdk's ProgressReporter).
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) {
    return ErrnoStatus("socketpair");
  }
  UniqueFd progress_read(sv[0]), progress_write(sv[1]);
  watch(progress_read.get(), kProgressTag);

  ConsoleStream* console_out = opts_.console_out ? opts_.console_out : &ConsoleOut();
  ConsoleStream* console_err = opts_.console_err ? opts_.console_err : &ConsoleErr();
  watch(console_out->ready_fd(), kConsoleTag);
  if (console_err != console_out) watch(console_err->ready_fd(), kConsoleTag);

  UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null.valid()) return ErrnoStatus("cannot open /dev/null");
  StdinRelay stdin_relay;
  if (::isatty(opts_.stdin_fd)) {
    const std::string self = absl::StrCat("/proc/self/fd/", opts_.stdin_fd);
    stdin_relay.tty.Reset(::open(self.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!stdin_relay.tty.valid()) spdlog::warn("cannot reopen the terminal on stdin: workers read /dev/null");
  }

  // Before the slots: their relays write to these until they are gone.
  UniqueFd filtered_out, filtered_err;
  std::vector<Slot> slots(launches.size());
  StartedWorkers started(&slots, launcher_, guard_);
  if (launcher_->exit_fd() >= 0) watch(launcher_->exit_fd(), kExitTag);

  // Every decision is the supervisor's; this runs what it decides. An action can lead to an
  // event (captures that need no process are done at once): events queue, and are taken in order.
  SupervisorState state;
  StackCaptures captures;
  bool stacks_captured = false;
  // The captures are done: the hung worker is the one the stacks show outside a collective when
  // the one first silent waits in one (a rank that waits for a hung peer stops reporting too).
  auto CapturesDone = [&] {
    int hung = state.hung;
    std::vector<std::vector<std::string>> frames(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].launch && slots[i].last_progress) frames[i] = WorkerFrames(*slots[i].launch);
    }
    if (hung >= 0 && WaitsInCollective(frames[hung])) {
      for (size_t i = 0; i < slots.size(); ++i) {
        if (static_cast<int>(i) == hung || frames[i].empty() || WaitsInCollective(frames[i])) continue;
        spdlog::warn("rank {} waits in a collective, rank {} does not: rank {} is the hung one", slots[hung].result.rank,
                     slots[i].result.rank, slots[i].result.rank);
        slots[i].result.hung_after_seconds = slots[hung].result.hung_after_seconds;
        slots[hung].result.hung = false;
        slots[i].result.hung = true;
        hung = static_cast<int>(i);
        break;
      }
    }
    if (hung >= 0) {
      slots[hung].result.stack_top = TopFrames(frames[hung], 3);
      slots[hung].result.in_collective = WaitsInCollective(frames[hung]);
    }
    return SupervisorEvent::CapturesDone(hung);
  };
  std::deque<SupervisorEvent> events_due;
  bool applying = false;
  auto apply = [&](const SupervisorEvent& first) {
    events_due.push_back(first);
    if (applying) return;
    applying = true;
    while (!events_due.empty()) {
      const SupervisorEvent event = events_due.front();
      events_due.pop_front();
      const SupervisorStep step = Supervise(opts_.stop, state, event);
      state = step.state;
      const SupervisorActions& a = step.actions;
      if (!a.warning.empty()) spdlog::warn("{}", a.warning);
      if (a.capture_stacks) {
        stacks_captured = true;
        captures.Start(slots, launcher_, opts_.hang.debugger);
        if (captures.done()) events_due.push_back(CapturesDone());
      }
      if (a.signal_groups) {
        for (auto& s : slots)
          if (s.pid > 0 && !s.group_gone) launcher_->SignalGroup(s.pid, a.signal_groups);
      }
      if (a.arm_grace) ArmTimer(stop_timer.get(), *a.arm_grace, false);
      if (a.report_failure >= 0 && opts_.on_failure) opts_.on_failure(slots[a.report_failure].result);
    }
    applying = false;
  };

  if (!opts_.stdout_filters.empty()) {
    ASSIGN_OR_RETURN(filtered_out, OpenLog(opts_.filtered_stdout_file));
  }
  if (!opts_.stderr_filters.empty()) {
    ASSIGN_OR_RETURN(filtered_err, OpenLog(opts_.filtered_stderr_file));
  }
  // Spawn every worker; a worker that cannot start stops those already started. Warm workers are
  // sent their go first and taken after, so that their standbys fork side by side.
  if (opts_.live) opts_.live->StartAttempt(launches);
  struct Pending {
    Pipe in, out, err;
    int stdin_fd = -1;
    bool sent = false;  // its standby has its go
  };
  std::vector<Pending> pending(launches.size());
  for (size_t i = 0; i < launches.size(); ++i) {
    const WorkerLaunch& l = launches[i];
    Slot& s = slots[i];
    Pending& p = pending[i];
    s.launch = &l;
    s.result.local_rank = l.local_rank;
    s.result.rank = l.rank;
    auto out_file = OpenLog(l.stdout_file);
    auto err_file = OpenLog(l.stderr_file);
    if (!out_file.ok() || !err_file.ok()) return out_file.ok() ? err_file.status() : out_file.status();
    s.out_file = std::move(*out_file);
    s.err_file = std::move(*err_file);
    std::string prefix = !l.console_prefix.empty()
                             ? l.console_prefix
                             : absl::StrReplaceAll(opts_.console_prefix_format, {{"{rank}", std::to_string(l.rank)}});
    s.out_console = l.stdout_console ? console_out : nullptr;
    s.err_console = l.stderr_console ? console_err : nullptr;
    s.out = std::make_unique<LineRelay>(LineRelay::Options{prefix, s.out_console, s.out_file.get(), 0,
                                                           &opts_.stdout_filters, filtered_out.get()});
    s.err = std::make_unique<LineRelay>(LineRelay::Options{prefix, s.err_console, s.err_file.get(),
                                                           opts_.stderr_tail_lines, &opts_.stderr_filters,
                                                           filtered_err.get()});
    p.stdin_fd = dev_null.get();
    if (l.reads_stdin && stdin_relay.tty.valid()) {
      if (!MakePipe(&p.in)) return ErrnoStatus("pipe");
      p.stdin_fd = p.in.read.get();
    } else if (l.reads_stdin) {
      p.stdin_fd = opts_.stdin_fd;
    }
  }
  // Every go sent is taken, even when a later worker's pipes cannot be made: a worker forked and
  // not taken would be nobody's. A warm worker's write ends are closed once its standby has them,
  // so that launch holds no more descriptors at once than one worker's spawn needs.
  auto take_sent = [&] {
    for (size_t i = 0; i < launches.size(); ++i) {
      Pending& p = pending[i];
      if (!p.sent) continue;
      p.sent = false;
      if (std::optional<pid_t> pid = opts_.warm->Take(launches[i])) {
        slots[i].pid = *pid;
      } else {
        p.out.read.Reset();  // cold, below, through new pipes
        p.err.read.Reset();
      }
    }
  };
  for (size_t i = 0; i < launches.size() && opts_.warm; ++i) {
    Pending& p = pending[i];
    if (!MakePipe(&p.out) || !MakePipe(&p.err)) {
      const absl::Status st = ErrnoStatus("pipe");
      take_sent();
      return st;
    }
    slots[i].start = clock_->Now();
    p.sent = opts_.warm->Send(launches[i], {progress_write.get(), p.stdin_fd, p.out.write.get(), p.err.write.get()});
    p.out.write.Reset();
    p.err.write.Reset();
    if (!p.sent) {
      p.out.read.Reset();
      p.err.read.Reset();
    }
  }
  take_sent();
  for (size_t i = 0; i < launches.size(); ++i) {
    const WorkerLaunch& l = launches[i];
    Slot& s = slots[i];
    Pending& p = pending[i];
    if (s.pid < 0) {
      if (!MakePipe(&p.out) || !MakePipe(&p.err)) return ErrnoStatus("pipe");
      s.start = clock_->Now();
      SpawnOptions so;
      so.cpus = l.cpus;
      so.preferred_memory_node = l.memory_node;
      so.stdin_fd = p.stdin_fd;
      so.argv = l.argv;
      so.env = l.env;
      so.stdout_fd = p.out.write.get();
      so.stderr_fd = p.err.write.get();
      so.extra_fd = progress_write.get();
      so.extra_fd_target = kProgressFd;
      // Registered by the child itself before exec: a launch killed right after a worker started
      // (before it could register the group here) left that worker's children running.
      so.guard_fd = guard_ ? guard_->fd() : -1;
      auto pid = launcher_->Spawn(so);
      if (!pid.ok()) return pid.status();
      s.pid = *pid;
    }
    p.out.write.Reset();
    p.err.write.Reset();
    s.out_read = std::move(p.out.read);
    s.err_read = std::move(p.err.read);
    s.result.pid = s.pid;
    if (opts_.live) opts_.live->Spawned(i, s.pid);
    if (opts_.on_spawned) opts_.on_spawned(s.result);
    if (opts_.exit_notices) opts_.exit_notices->Watch(l.local_rank, s.pid);
    ++state.running;
    if (p.in.write.valid()) {
      ::fcntl(p.in.write.get(), F_SETFL, O_NONBLOCK);
      stdin_relay.to_worker = std::move(p.in.write);
    }
    p.in.read.Reset();
    for (int fd : {s.out_read.get(), s.err_read.get()}) ::fcntl(fd, F_SETFL, O_NONBLOCK);
    watch(s.out_read.get(), i);
    watch(s.err_read.get(), i | kStderrBit);
  }
  if (opts_.on_started) opts_.on_started();
  bool stepping_told = false;  // on_stepping was called
  auto tell_stepping = [&] {
    if (stepping_told || !opts_.on_stepping) return;
    stepping_told = true;
    opts_.on_stepping();
  };
  // Workers that report no steps: on_stepping once they have run for stepping_wait.
  UniqueFd stepping_timer;
  if (opts_.on_stepping) {
    stepping_timer.Reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    if (!stepping_timer.valid()) return ErrnoStatus("timerfd_create");
    ArmTimer(stepping_timer.get(), opts_.stepping_wait, false);
    watch(stepping_timer.get(), kSteppingTimerTag);
  }

  char buf[65536];
  auto drain = [&](Slot& s, bool is_err, bool final) {
    UniqueFd& fd = is_err ? s.err_read : s.out_read;
    LineRelay& relay = is_err ? *s.err : *s.out;
    while (fd.valid()) {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n > 0) {
        relay.Feed(buf, static_cast<size_t>(n), clock_->Now());
        if (!final) return;  // level-triggered: come back for more, let others speak too
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN && !final) return;
      relay.Flush();  // EOF (or nothing more to expect)
      ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, fd.get(), nullptr);
      fd.Reset();
    }
  };

  // How a worker ended (or, from its exit notice, is ending), and its error file's message.
  auto set_status = [&](Slot& s, int exit_code, int signal) {
    s.result.exit_code = exit_code;
    s.result.signal = signal;
    if (s.result.failed()) {
      if (auto info = ReadErrorFile(s.launch->error_file); info.ok()) s.result.error_message = info->message;
    }
  };

  auto reap = [&] {
    while (std::optional<ChildExit> exit = launcher_->ReapAny()) {
      if (captures.Reaped(exit->pid)) {
        if (captures.done() && state.phase == SupervisorState::Phase::kCapturing) apply(CapturesDone());
        continue;
      }
      for (size_t i = 0; i < slots.size(); ++i) {
        Slot& s = slots[i];
        if (s.pid != exit->pid || s.reaped) continue;
        s.reaped = true;
        if (opts_.live) opts_.live->Exited(i);
        Clock::TimePoint now = clock_->Now();
        s.result.ended = now;
        s.result.run_seconds = SecondsBetween(s.start, now);
        set_status(s, exit->exit_code, exit->signal);
        apply(SupervisorEvent::Exited(static_cast<int>(i), s.result.failed()));
      }
      // Anything else is a worker's orphaned child, reparented to us (a subreaper): just reaped.
    }
  };

  auto read_signals = [&] {
    while (int sig = signals_->Read()) {
      if (sig == SIGCHLD) {
        reap();
      } else {
        apply(SupervisorEvent::Signal(sig));
      }
    }
  };

  // A worker that reported steps and then none for its timeout is hung (the longest silent first).
  auto check_hangs = [&] {
    if (state.phase != SupervisorState::Phase::kRunning) return;
    const Clock::TimePoint now = clock_->Now();
    int hung = -1;
    std::chrono::milliseconds hung_timeout{0};
    for (size_t i = 0; i < slots.size(); ++i) {
      const Slot& s = slots[i];
      if (s.reaped || !s.last_progress) continue;
      std::chrono::milliseconds timeout = opts_.hang.timeout.value_or(std::max(
          opts_.hang.floor, std::chrono::milliseconds(static_cast<int64_t>(opts_.hang.factor * Median(s.step_seconds) * 1000))));
      if (now - *s.last_progress <= timeout) continue;
      if (hung < 0 || *s.last_progress < *slots[hung].last_progress) {
        hung = static_cast<int>(i);
        hung_timeout = timeout;
      }
    }
    if (hung < 0) return;
    Slot& s = slots[hung];
    s.result.hung = true;
    s.result.hung_after_seconds = SecondsBetween(*s.last_progress, now);
    spdlog::warn("rank {} (pid {}) reported no step for {:.1f} s (last step {}, hang timeout {:.1f} s): hung; "
                 "capturing every worker's stacks, then stopping them",
                 s.result.rank, s.pid, s.result.hung_after_seconds, s.result.last_step, hung_timeout.count() / 1000.0);
    apply(SupervisorEvent::Hung(hung));
  };

  for (;;) {
    // Done when every worker is reaped and nothing is left in their process groups.
    if (state.running == 0) {
      bool any_alive = false;
      for (auto& s : slots) {
        if (!s.group_gone && !launcher_->GroupAlive(s.pid)) s.group_gone = true;
        if (s.group_gone) continue;
        any_alive = true;
        if (state.phase == SupervisorState::Phase::kRunning) {
          spdlog::warn("rank {} exited but left processes in its group {}; stopping them", s.result.rank, s.pid);
        }
      }
      apply(SupervisorEvent::GroupsChecked(!any_alive));
      if (state.phase == SupervisorState::Phase::kDone) break;
    }

    // Workers shown on a backlogged console are not read (they wait in their writes) until it
    // drains: supervision goes on whatever the console does.
    auto set_reading = [&](UniqueFd& fd, bool* reading, uint64_t tag, bool want) {
      if (!fd.valid() || *reading == want) return;
      epoll_event ev{};
      ev.events = want ? static_cast<uint32_t>(EPOLLIN) : 0u;
      ev.data.u64 = tag;
      ::epoll_ctl(ep.get(), EPOLL_CTL_MOD, fd.get(), &ev);
      *reading = want;
    };
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      set_reading(s.out_read, &s.out_reading, i, !(s.out_console && s.out_console->backlogged()));
      set_reading(s.err_read, &s.err_reading, i | kStderrBit, !(s.err_console && s.err_console->backlogged()));
    }
    UpdateStdinRelay(ep.get(), &stdin_relay);
    // A line left unfinished for a moment (a prompt) is shown as far as it goes.
    int timeout_ms = -1;
    if (captures.polling()) {  // a worker writes its own stacks: look at its file every 100 ms
      captures.Poll();
      if (captures.done() && state.phase == SupervisorState::Phase::kCapturing) apply(CapturesDone());
      if (captures.polling()) timeout_ms = 100;
    }
    const Clock::TimePoint now = clock_->Now();
    for (auto& s : slots) {
      for (LineRelay* r : {s.out.get(), s.err.get()}) {
        auto due = r ? r->partial_due() : std::nullopt;
        if (!due) continue;
        if (*due <= now) {
          r->ShowPartial();
          continue;
        }
        const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(*due - now).count());
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
    }

    epoll_event events[32];
    int n = ::epoll_wait(ep.get(), events, 32, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("epoll_wait");
    }
    for (int e = 0; e < n; ++e) {
      uint64_t tag = events[e].data.u64;
      if (tag == kSignalTag) {
        read_signals();
      } else if (tag == kExitNoticeTag) {
        // A signal launch got first is taken first (a scheduler's SIGTERM to every process of the
        // job reaches the workers too: their notices must not make it a failure).
        read_signals();
        for (const ExitNotices::Notice& notice : opts_.exit_notices->Take()) {
          for (size_t i = 0; i < slots.size(); ++i) {
            Slot& s = slots[i];
            if (s.pid != notice.pid || s.reaped || s.result.exit_noticed) continue;
            s.result.exit_noticed = true;
            set_status(s, WIFEXITED(notice.status) ? WEXITSTATUS(notice.status) : 0,
                       WIFSIGNALED(notice.status) ? WTERMSIG(notice.status) : 0);
            if (!s.result.failed()) continue;
            spdlog::debug("rank {} (pid {}) is exiting ({}), seen from its exit notice", s.result.rank, s.pid,
                          s.result.StatusText());
            apply(SupervisorEvent::Failing(static_cast<int>(i)));
          }
        }
      } else if (tag == kExitTag) {
        DrainTimer(launcher_->exit_fd());
        reap();
      } else if (tag == kStopTimerTag) {
        DrainTimer(stop_timer.get());
        apply(SupervisorEvent::GraceOver());
      } else if (tag == kSteppingTimerTag) {
        DrainTimer(stepping_timer.get());
        tell_stepping();
      } else if (tag == kHangTimerTag) {
        DrainTimer(hang_timer.get());
        check_hangs();
      } else if (tag == kProgressTag) {
        // Progress records and stack-dump offers share the socket; size and magic tell them apart.
        alignas(8) char datagram[64];
        ssize_t got;
        while ((got = ::recv(progress_read.get(), datagram, sizeof datagram, 0)) >= 0) {
          launch_sdk::ProgressRecord rec;
          launch_sdk::StackDumpRecord offer;
          if (got == static_cast<ssize_t>(sizeof rec) || got == static_cast<ssize_t>(launch_sdk::kProgressRecordV1Bytes)) {
            std::memcpy(&rec, datagram, static_cast<size_t>(got));  // a first-version record: no wait time
            if (rec.magic != launch_sdk::ProgressRecord{}.magic) continue;
            const Clock::TimePoint now = clock_->Now();
            for (size_t i = 0; i < slots.size(); ++i) {
              Slot& s = slots[i];
              if (s.result.rank != rec.rank) continue;
              s.result.last_step = rec.step;
              s.result.last_loss = rec.loss;
              s.result.last_step_seconds = rec.step_seconds;
              s.last_progress = now;
              if (rec.step_seconds > 0 && std::isfinite(rec.step_seconds)) {
                s.step_seconds.push_back(rec.step_seconds);
                if (s.step_seconds.size() > kStepTimesKept) s.step_seconds.pop_front();
              }
              if (opts_.live) opts_.live->Progress(i, rec.step, rec.step_seconds, rec.wait_seconds, now);
            }
          } else if (got == static_cast<ssize_t>(sizeof offer)) {
            std::memcpy(&offer, datagram, sizeof offer);
            if (offer.magic != launch_sdk::StackDumpRecord{}.magic || offer.signal <= 0 || offer.signal >= 65) continue;
            for (auto& s : slots)
              if (s.result.rank == offer.rank) s.stack_signal = offer.signal;
          }
        }
        if (std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.last_progress.has_value(); })) {
          tell_stepping();
        } else if (stepping_timer.valid() && std::any_of(slots.begin(), slots.end(), [](const Slot& s) {
                     return s.last_progress.has_value();
                   })) {
          // The workers report steps: on_stepping waits for every one of them, however long.
          ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, stepping_timer.get(), nullptr);
          stepping_timer.Reset();
        }
      } else if (tag == kConsoleTag) {
        DrainTimer(console_out->ready_fd());  // eventfds: a read clears them
        DrainTimer(console_err->ready_fd());
      } else if (tag == kStdinTag) {
        char in[4096];
        ssize_t got = ::read(stdin_relay.tty.get(), in, sizeof in);
        if (got > 0) {
          stdin_relay.pending.append(in, static_cast<size_t>(got));
          // The terminal echoed the line: the prompt's line is over on the screen.
          console_out->LineEndedElsewhere();
          console_err->LineEndedElsewhere();
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
          // EOF (Ctrl-D) reaches the worker as EOF; EIO: launch was put in the background.
          stdin_relay.done = true;
        }
        FlushStdinRelay(&stdin_relay);
      } else if (tag == kStdinPipeTag) {
        FlushStdinRelay(&stdin_relay);
      } else if (tag == kCoordinatorTag) {
        // Level-triggered and never drained: seen once, then out of the set.
        ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, opts_.stop_fd, nullptr);
        apply(SupervisorEvent::CoordinatorStop(opts_.stop_wants_stacks && opts_.stop_wants_stacks()));
      } else {
        drain(slots[tag & 0xffffffff], (tag & kStderrBit) != 0, false);
      }
    }
  }

  captures.KillLeft(launcher_);
  // A hung worker whose stacks came too late for the capture still gets the frames that came.
  if (state.hung >= 0 && slots[state.hung].result.stack_top.empty() && slots[state.hung].launch) {
    slots[state.hung].result.stack_top = TopFrames(WorkerFrames(*slots[state.hung].launch), 3);
  }
  GroupOutcome outcome;
  outcome.stacks_captured = stacks_captured;
  outcome.kind = state.end;
  outcome.signal = state.end == GroupEnd::kInterrupted ? state.signal : 0;
  outcome.root_cause = state.end == GroupEnd::kFailed ? state.root_cause : -1;
  for (auto& s : slots) {
    drain(s, false, true);
    drain(s, true, true);
    s.result.stderr_tail = s.err->tail();
    started.Unregister(s);
    outcome.workers.push_back(s.result);
  }
  return outcome;
}

std::string WorkerResult::StatusText() const {
  if (hung) return "hung";
  return signal ? SignalName(signal) : absl::StrCat("exit ", exit_code);
}

std::string FailureSummary(const GroupOutcome& outcome, const std::string& headline) {
  std::string out = absl::StrCat(headline, "\n");
  absl::StrAppend(&out, "  rank  local  pid       status        time     last step   error\n");
  for (size_t i = 0; i < outcome.workers.size(); ++i) {
    const WorkerResult& w = outcome.workers[i];
    if (!w.failed()) continue;
    char line[256];
    std::string step = w.last_step < 0 ? "-" : std::to_string(w.last_step);
    std::snprintf(line, sizeof line, "  %-5d %-6d %-9d %-13s %6.2fs  %-10s  ", w.rank, w.local_rank, w.pid,
                  w.StatusText().c_str(), w.run_seconds, step.c_str());
    std::string msg = w.error_message.substr(0, w.error_message.find('\n'));
    if (w.hung && msg.empty()) msg = absl::StrFormat("no step for %.1f s", w.hung_after_seconds);
    absl::StrAppend(&out, line, msg.empty() ? "-" : msg,
                    static_cast<int>(i) == outcome.root_cause ? "   <- root cause" : "", "\n");
    for (const auto& f : w.stack_top) absl::StrAppend(&out, "        [", w.rank, "] stack: ", f, "\n");
    for (const auto& t : w.stderr_tail) absl::StrAppend(&out, "        [", w.rank, "] stderr: ", t, "\n");
  }
  return out;
}

}  // namespace launch
