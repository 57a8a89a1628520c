#include "agent/worker_group.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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
};

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

// What an epoll event is for: encoded in data.u64.
constexpr uint64_t kSignalTag = 1ull << 40;
constexpr uint64_t kStopTimerTag = 2ull << 40;
constexpr uint64_t kCoordinatorTag = 3ull << 40;
constexpr uint64_t kProgressTag = 4ull << 40;
constexpr uint64_t kConsoleTag = 5ull << 40;
constexpr uint64_t kStdinTag = 6ull << 40;
constexpr uint64_t kStdinPipeTag = 7ull << 40;
constexpr uint64_t kExitTag = 8ull << 40;
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
  if (opts_.stop_fd >= 0) watch(opts_.stop_fd, kCoordinatorTag);

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

  std::vector<Slot> slots(launches.size());
  StartedWorkers started(&slots, launcher_, guard_);
  if (launcher_->exit_fd() >= 0) watch(launcher_->exit_fd(), kExitTag);

  // Every decision is the supervisor's; this runs what it decides.
  SupervisorState state;
  auto apply = [&](const SupervisorEvent& event) {
    const SupervisorStep step = Supervise(opts_.stop, state, event);
    state = step.state;
    const SupervisorActions& a = step.actions;
    if (!a.warning.empty()) spdlog::warn("{}", a.warning);
    if (a.signal_groups) {
      for (auto& s : slots)
        if (s.pid > 0 && !s.group_gone) launcher_->SignalGroup(s.pid, a.signal_groups);
    }
    if (a.arm_grace) ArmTimer(stop_timer.get(), *a.arm_grace, false);
    if (a.report_failure >= 0 && opts_.on_failure) opts_.on_failure(slots[a.report_failure].result);
  };

  // Spawn every worker; a worker that cannot start stops those already started.
  for (size_t i = 0; i < launches.size(); ++i) {
    const WorkerLaunch& l = launches[i];
    Slot& s = slots[i];
    s.launch = &l;
    s.result.local_rank = l.local_rank;
    s.result.rank = l.rank;
    Pipe out, err;
    if (!MakePipe(&out) || !MakePipe(&err)) return ErrnoStatus("pipe");
    auto out_file = OpenLog(l.stdout_file);
    auto err_file = OpenLog(l.stderr_file);
    if (!out_file.ok() || !err_file.ok()) return out_file.ok() ? err_file.status() : out_file.status();
    s.out_file = std::move(*out_file);
    s.err_file = std::move(*err_file);
    std::string prefix =
        absl::StrReplaceAll(opts_.console_prefix_format, {{"{rank}", std::to_string(l.rank)}});
    s.out_console = l.stdout_console ? console_out : nullptr;
    s.err_console = l.stderr_console ? console_err : nullptr;
    s.out = std::make_unique<LineRelay>(LineRelay::Options{prefix, s.out_console, s.out_file.get(), 0});
    s.err = std::make_unique<LineRelay>(
        LineRelay::Options{prefix, s.err_console, s.err_file.get(), opts_.stderr_tail_lines});
    SpawnOptions so;
    Pipe in;
    so.stdin_fd = dev_null.get();
    if (l.reads_stdin && stdin_relay.tty.valid()) {
      if (!MakePipe(&in)) return ErrnoStatus("pipe");
      so.stdin_fd = in.read.get();
    } else if (l.reads_stdin) {
      so.stdin_fd = opts_.stdin_fd;
    }
    so.argv = l.argv;
    so.env = l.env;
    so.stdout_fd = out.write.get();
    so.stderr_fd = err.write.get();
    so.extra_fd = progress_write.get();
    so.extra_fd_target = kProgressFd;
    // Registered by the child itself before exec: a launch killed right after a worker started
    // (before it could register the group here) left that worker's children running.
    so.guard_fd = guard_ ? guard_->fd() : -1;
    s.start = clock_->Now();
    auto pid = launcher_->Spawn(so);
    if (!pid.ok()) return pid.status();
    s.pid = *pid;
    s.result.pid = *pid;
    ++state.running;
    if (in.write.valid()) {
      ::fcntl(in.write.get(), F_SETFL, O_NONBLOCK);
      stdin_relay.to_worker = std::move(in.write);
    }
    s.out_read = std::move(out.read);
    s.err_read = std::move(err.read);
    for (int fd : {s.out_read.get(), s.err_read.get()}) ::fcntl(fd, F_SETFL, O_NONBLOCK);
    watch(s.out_read.get(), i);
    watch(s.err_read.get(), i | kStderrBit);
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

  auto reap = [&] {
    while (std::optional<ChildExit> exit = launcher_->ReapAny()) {
      for (size_t i = 0; i < slots.size(); ++i) {
        Slot& s = slots[i];
        if (s.pid != exit->pid || s.reaped) continue;
        s.reaped = true;
        Clock::TimePoint now = clock_->Now();
        s.result.ended = now;
        s.result.run_seconds = SecondsBetween(s.start, now);
        s.result.exit_code = exit->exit_code;
        s.result.signal = exit->signal;
        if (s.result.failed()) {
          if (auto info = ReadErrorFile(s.launch->error_file); info.ok()) {
            s.result.error_message = info->message;
          }
        }
        apply(SupervisorEvent::Exited(static_cast<int>(i), s.result.failed()));
      }
      // Anything else is a worker's orphaned child, reparented to us (a subreaper): just reaped.
    }
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
        while (int sig = signals_->Read()) {
          if (sig == SIGCHLD) {
            reap();
          } else {
            apply(SupervisorEvent::Signal(sig));
          }
        }
      } else if (tag == kExitTag) {
        DrainTimer(launcher_->exit_fd());
        reap();
      } else if (tag == kStopTimerTag) {
        DrainTimer(stop_timer.get());
        apply(SupervisorEvent::GraceOver());
      } else if (tag == kProgressTag) {
        launch_sdk::ProgressRecord rec;
        while (::recv(progress_read.get(), &rec, sizeof rec, 0) == static_cast<ssize_t>(sizeof rec)) {
          if (rec.magic != launch_sdk::ProgressRecord{}.magic) continue;
          for (auto& s : slots) {
            if (s.result.rank != rec.rank) continue;
            s.result.last_step = rec.step;
            s.result.last_loss = rec.loss;
            s.result.last_step_seconds = rec.step_seconds;
          }
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
        apply(SupervisorEvent::CoordinatorStop());
      } else {
        drain(slots[tag & 0xffffffff], (tag & kStderrBit) != 0, false);
      }
    }
  }

  GroupOutcome outcome;
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
    absl::StrAppend(&out, line, msg.empty() ? "-" : msg,
                    static_cast<int>(i) == outcome.root_cause ? "   <- root cause" : "", "\n");
    for (const auto& t : w.stderr_tail) absl::StrAppend(&out, "        [", w.rank, "] stderr: ", t, "\n");
  }
  return out;
}

}  // namespace launch
