#include "agent/worker_group.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "agent/error_file.h"
#include "agent/log_relay.h"
#include "agent/worker_env.h"
#include "common/event_loop.h"
#include "common/status_macros.h"
#include "launch_sdk/progress.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {

using Phase = SupervisorState::Phase;

constexpr size_t kStepTimesKept = 101;
// How often the file of a worker that writes its own stacks is looked at: done once it stops growing.
constexpr std::chrono::milliseconds kStackFilePoll{100};
// The terminal's input held for the worker at most; past it the terminal is not read.
constexpr size_t kStdinHeld = 65536;

double Median(std::deque<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Clears an eventfd (a read returns and resets its count).
void ClearCounter(int fd) {
  uint64_t count;
  ssize_t n = ::read(fd, &count, sizeof count);
  (void)n;
}

absl::StatusOr<UniqueFd> OpenLog(const std::string& path) {
  if (path.empty()) return UniqueFd();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(absl::StrCat("cannot open log file ", path));
  return UniqueFd(fd);
}

// One of a worker's output pipes, read into its line relay. Workers shown on a backlogged console
// are not read (they wait in their writes) until it drains: supervision goes on whatever the
// console does.
struct OutputPipe {
  UniqueFd fd;
  std::unique_ptr<LineRelay> relay;
  ConsoleStream* console = nullptr;  // where its lines are shown (nullptr: not shown)
  bool reading = true;               // watched for reading
};

struct Slot {
  const WorkerLaunch* launch = nullptr;
  pid_t pid = -1;
  bool reaped = false;
  bool group_gone = false;
  bool unregistered = false;  // removed from the orphan guard
  bool merged = false;        // stdout and stderr through one pipe (Options::one_console)
  Clock::TimePoint start{};
  UniqueFd out_file, err_file;  // before the pipes: their relays write to these
  OutputPipe out, err;
  WorkerResult result;
  // Progress: when the last report came, and the latest step times (for the median).
  std::optional<Clock::TimePoint> last_progress;
  bool named_steps = false;  // the worker reports its own steps: launch's counted ones are ignored
  std::deque<double> step_seconds;
  int stack_signal = 0;  // the worker dumps its own stacks on this signal (StackDumpRecord)
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
    if (s.pid > 0 && !s.unregistered) {
      if (guard_) guard_->Remove(s.pid);
      RemoveStoppableGroup(s.pid);
    }
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

// A terminal on launch's stdin, relayed to the worker that reads stdin: launch is in the
// terminal's foreground group, the workers are not (each leads its own group). The terminal is
// read while the worker's end is open and not backed up; that end is watched while it holds back
// what the worker has not read.
//
// When launch's stdout is that terminal too, the worker gets a pseudo-terminal of its own (its
// stdin, stdout and stderr, and its controlling terminal), as it has the terminal itself under
// torchrun: isatty() is true, the size is the terminal's (followed when it changes), and pdb,
// readline and progress bars behave. launch's terminal then passes keys on as typed (no echo, no
// line editing: the worker's terminal does those, or readline does) while Ctrl-C and Ctrl-Z still
// signal launch, and gets its settings back when the worker is gone.
class StdinRelay {
 public:
  StdinRelay(EventLoop* loop, ConsoleStream* out, ConsoleStream* err) : loop_(loop), out_(out), err_(err) {}
  ~StdinRelay() {
    Close();
    RestoreTerminal();
  }

  // A pseudo-terminal for the worker that reads stdin, sized and set as launch's terminal (its
  // output without CR-LF translation: launch's terminal does that), when launch's stdin and
  // stdout are that terminal and launch is in its foreground; {} otherwise.
  struct Pty {
    UniqueFd master, slave;
  };
  std::optional<Pty> OpenPty(int stdout_fd) {
    if (!tty_.valid() || !::isatty(stdout_fd) || ::tcgetpgrp(tty_.get()) != ::getpgrp()) return std::nullopt;
    termios mode{};
    winsize size{};
    if (::tcgetattr(tty_.get(), &mode) != 0) return std::nullopt;
    if (::ioctl(stdout_fd, TIOCGWINSZ, &size) != 0) size = winsize{};
    Pty pty;
    pty.master.Reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    char name[128];
    if (!pty.master.valid() || ::grantpt(pty.master.get()) != 0 || ::unlockpt(pty.master.get()) != 0 ||
        ::ptsname_r(pty.master.get(), name, sizeof name) != 0) {
      spdlog::debug("no pseudo-terminal for the worker that reads stdin: {}", std::strerror(errno));
      return std::nullopt;
    }
    pty.slave.Reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!pty.slave.valid()) return std::nullopt;
    mode.c_oflag &= ~static_cast<tcflag_t>(ONLCR);
    ::tcsetattr(pty.slave.get(), TCSANOW, &mode);
    if (size.ws_row > 0 && size.ws_col > 0) ::ioctl(pty.master.get(), TIOCSWINSZ, &size);
    size_ = size;
    size_from_ = stdout_fd;
    return pty;
  }
  // The worker's pseudo-terminal (its master side): keys go there as typed, and its size follows
  // launch's terminal.
  void SetWorkerTerminal(UniqueFd master) {
    if (!saved_) {
      termios mode{};
      if (::tcgetattr(tty_.get(), &mode) == 0) {
        saved_ = mode;
        mode.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO | ECHOE | ECHOK | ECHONL | IEXTEN);
        mode.c_iflag &= ~static_cast<tcflag_t>(ICRNL | INLCR | IGNCR | IXON);
        mode.c_cc[VMIN] = 1;
        mode.c_cc[VTIME] = 0;
        ::tcsetattr(tty_.get(), TCSADRAIN, &mode);
      }
    }
    pty_master_ = master.get();
    SetWorker(std::move(master));
    if (!resize_timer_) resize_timer_ = loop_->MakeTimer([this] { FollowSize(); });
    resize_timer_->Arm(kResizePoll);
  }

  // Opens the terminal on `stdin_fd` with a description of its own (non-blocking without touching
  // the shell's), when it is one.
  void Open(int stdin_fd) {
    if (!::isatty(stdin_fd)) return;
    const std::string self = absl::StrCat("/proc/self/fd/", stdin_fd);
    tty_.Reset(::open(self.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!tty_.valid()) spdlog::warn("cannot reopen the terminal on stdin: workers read /dev/null");
  }
  bool active() const { return tty_.valid(); }
  // The write end of the pipe the worker reads as its stdin.
  void SetWorker(UniqueFd pipe) {
    ::fcntl(pipe.get(), F_SETFL, O_NONBLOCK);
    to_worker_ = std::move(pipe);
  }
  // Before each wait: what to watch for.
  void Update() {
    if (!tty_.valid()) return;
    Want(tty_.get(), EPOLLIN, to_worker_.valid() && !done_ && pending_.size() < kStdinHeld, &reading_,
         [this](uint32_t) { OnTerminal(); });
    if (to_worker_.valid()) {
      Want(to_worker_.get(), EPOLLOUT, !pending_.empty(), &writing_, [this](uint32_t) { Flush(); });
    }
  }

 private:
  void Want(int fd, uint32_t events, bool want, bool* in_set, EventLoop::Handler handler) {
    if (want == *in_set) return;
    if (want) {
      loop_->Watch(fd, events, std::move(handler));
    } else {
      loop_->Unwatch(fd);
    }
    *in_set = want;
  }
  void OnTerminal() {
    char in[4096];
    ssize_t got = ::read(tty_.get(), in, sizeof in);
    if (got > 0) {
      pending_.append(in, static_cast<size_t>(got));
      // The terminal echoed the line: the prompt's line is over on the screen. (The worker's own
      // terminal echoes in its output instead.)
      if (pty_master_ < 0) {
        out_->LineEndedElsewhere();
        err_->LineEndedElsewhere();
      }
    } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
      // EOF (Ctrl-D) reaches the worker as EOF; EIO: launch was put in the background.
      done_ = true;
    }
    Flush();
  }
  // Hands the worker what the terminal gave, as far as its pipe takes it.
  void Flush() {
    while (to_worker_.valid() && !pending_.empty()) {
      ssize_t w = ::write(to_worker_.get(), pending_.data(), pending_.size());
      if (w > 0) {
        pending_.erase(0, static_cast<size_t>(w));
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) return;  // the worker reads later: wait for EPOLLOUT
      pending_.clear();                      // EPIPE: the worker closed its stdin or is gone
      done_ = true;
    }
    if (done_ && pending_.empty() && to_worker_.valid()) {
      if (writing_) loop_->Unwatch(to_worker_.get());
      writing_ = false;
      to_worker_.Reset();  // the worker reads EOF
      RestoreTerminal();   // its terminal is gone: launch's echoes and edits lines again
    }
  }
  void Close() {
    if (reading_) loop_->Unwatch(tty_.get());
    if (writing_) loop_->Unwatch(to_worker_.get());
    reading_ = writing_ = false;
  }
  void RestoreTerminal() {
    if (saved_) ::tcsetattr(tty_.get(), TCSADRAIN, &*saved_);
    saved_.reset();
  }
  // launch's terminal changed size: so does the worker's (whose foreground group gets SIGWINCH).
  void FollowSize() {
    if (!to_worker_.valid() || to_worker_.get() != pty_master_) return;
    winsize now{};
    if (::ioctl(size_from_, TIOCGWINSZ, &now) == 0 && now.ws_row > 0 && now.ws_col > 0 &&
        (now.ws_row != size_.ws_row || now.ws_col != size_.ws_col)) {
      ::ioctl(pty_master_, TIOCSWINSZ, &now);
      size_ = now;
    }
    resize_timer_->Arm(kResizePoll);
  }
  static constexpr std::chrono::milliseconds kResizePoll{200};

  EventLoop* loop_;
  ConsoleStream* out_;
  ConsoleStream* err_;
  UniqueFd tty_;
  UniqueFd to_worker_;            // the pipe's write end, non-blocking
  std::string pending_;           // read from the terminal, not yet taken by the worker
  bool reading_ = false;          // the terminal is watched
  bool writing_ = false;          // the pipe is watched (the worker has not taken everything)
  bool done_ = false;             // EOF, or the worker closed its end
  std::optional<termios> saved_;  // launch's terminal as it was, while keys pass as typed
  int pty_master_ = -1;           // to_worker_ when it is the worker's pseudo-terminal
  int size_from_ = -1;            // launch's terminal, whose size the worker's follows
  winsize size_{};
  std::unique_ptr<EventLoop::Timer> resize_timer_;
};

// Removes the group's workers from the exit notices however Run ends.
struct NoticesCleared {
  ExitNotices* notices;
  ~NoticesCleared() {
    if (notices) notices->Clear();
  }
};

// One Run of the group: its loop, its workers and each descriptor's handler, the supervisor's
// state and the shell that carries out the supervisor's actions. Every decision is the
// supervisor's (group_supervisor.h) or a pure check's (hang_check.h); this runs them.
class GroupRun {
 public:
  GroupRun(const WorkerGroup::Options& opts, ProcessLauncher* launcher, OrphanGuard* guard, SignalFd* signals,
           const Clock* clock, const std::vector<WorkerLaunch>& launches)
      : opts_(opts),
        launcher_(launcher),
        guard_(guard),
        signals_(signals),
        clock_(clock),
        launches_(launches),
        notices_cleared_{opts.exit_notices},
        console_out_(opts.console_out ? opts.console_out : &ConsoleOut()),
        console_err_(opts.console_err ? opts.console_err : &ConsoleErr()),
        slots_(launches.size()),
        started_(&slots_, launcher, guard) {}

  absl::Status Open();
  absl::Status StartWorkers();
  // One turn of the loop; done() once every worker is reaped and their groups are empty.
  absl::Status Turn();
  bool done() const { return state_.phase == Phase::kDone; }
  GroupOutcome Finish();

 private:
  struct Pending {  // a worker's descriptors while it starts
    Pipe in, out, err;
    int stdin_fd = -1;
    bool sent = false;  // its standby has its go
    // The worker's pseudo-terminal (StdinRelay): its stdin, stdout and stderr; started cold.
    UniqueFd pty_master, pty_slave;
  };
  absl::Status PrepareSlot(size_t i, Pending* p);
  absl::Status SendWarm(std::vector<Pending>* pending);
  void TakeSent(std::vector<Pending>* pending);
  absl::Status SpawnCold(size_t i, Pending* p);
  void Adopt(size_t i, Pending* p);
  void WatchOutput(OutputPipe* pipe);

  void Apply(const SupervisorEvent& first);
  void RunActions(const SupervisorActions& a);
  SupervisorEvent CapturesDone();
  void CheckGroups();
  void BeforeWait();

  void OnSignals();
  void OnExitNotices();
  void OnProgress();
  void OnProgressRecord(const launch_sdk::ProgressRecord& rec, bool counted);
  void OnCoordinatorStop();
  void Drain(OutputPipe* pipe, bool final);
  void Reap();
  void SetStatus(Slot* s, int exit_code, int signal);
  void CheckHangs();
  void TellStepping();
  void SayNoSteps();
  void PollStackFiles();
  void ShowDuePartials();

  const WorkerGroup::Options& opts_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
  SignalFd* signals_;
  const Clock* clock_;
  const std::vector<WorkerLaunch>& launches_;
  NoticesCleared notices_cleared_;  // first made, last gone: after the workers are
  std::unique_ptr<EventLoop> loop_;
  uint64_t continued_seen_ = ContinuedCount();
  std::unique_ptr<EventLoop::Timer> grace_timer_, hang_timer_, stepping_timer_, stack_poll_timer_, partial_timer_,
      no_steps_timer_;
  UniqueFd progress_read_, progress_write_;  // every worker's progress reports (one datagram socket)
  UniqueFd dev_null_;
  ConsoleStream* console_out_;
  ConsoleStream* console_err_;
  std::unique_ptr<StdinRelay> stdin_relay_;
  UniqueFd filtered_out_, filtered_err_;  // before the slots: their relays write to these
  std::vector<Slot> slots_;
  StartedWorkers started_;
  SupervisorState state_;
  StackCaptures captures_;
  bool stacks_captured_ = false;
  std::deque<SupervisorEvent> events_due_;
  bool applying_ = false;
  bool stepping_told_ = false;  // on_stepping was called
  char buf_[65536];
};

absl::Status GroupRun::Open() {
  ASSIGN_OR_RETURN(loop_, EventLoop::Create(clock_));
  grace_timer_ = loop_->MakeTimer([this] { Apply(SupervisorEvent::GraceOver()); });
  hang_timer_ = loop_->MakeTimer([this] { CheckHangs(); });
  stepping_timer_ = loop_->MakeTimer([this] { TellStepping(); });
  no_steps_timer_ = loop_->MakeTimer([this] { SayNoSteps(); });
  stack_poll_timer_ = loop_->MakeTimer([this] { PollStackFiles(); });
  partial_timer_ = loop_->MakeTimer([this] { ShowDuePartials(); });
  loop_->Watch(signals_->fd(), EPOLLIN, [this](uint32_t) { OnSignals(); });
  if (opts_.hang.enabled()) hang_timer_->Arm(opts_.hang.CheckPeriod());
  if (opts_.stop_fd >= 0) loop_->Watch(opts_.stop_fd, EPOLLIN, [this](uint32_t) { OnCoordinatorStop(); });
  // Watched from each worker's start, until the group ends however it ends.
  if (opts_.exit_notices) loop_->Watch(opts_.exit_notices->fd(), EPOLLIN, [this](uint32_t) { OnExitNotices(); });
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) return ErrnoStatus("socketpair");
  progress_read_.Reset(sv[0]);
  progress_write_.Reset(sv[1]);
  loop_->Watch(progress_read_.get(), EPOLLIN, [this](uint32_t) { OnProgress(); });
  for (ConsoleStream* c : {console_out_, console_err_}) {
    loop_->Watch(c->ready_fd(), EPOLLIN, [this](uint32_t) {
      ClearCounter(console_out_->ready_fd());
      ClearCounter(console_err_->ready_fd());
    });
  }
  dev_null_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null_.valid()) return ErrnoStatus("cannot open /dev/null");
  stdin_relay_ = std::make_unique<StdinRelay>(loop_.get(), console_out_, console_err_);
  stdin_relay_->Open(opts_.stdin_fd);
  if (launcher_->exit_fd() >= 0) {
    loop_->Watch(launcher_->exit_fd(), EPOLLIN, [this](uint32_t) {
      ClearCounter(launcher_->exit_fd());
      Reap();
    });
  }
  if (!opts_.stdout_filters.empty()) {
    ASSIGN_OR_RETURN(filtered_out_, OpenLog(opts_.filtered_stdout_file));
  }
  if (!opts_.stderr_filters.empty()) {
    ASSIGN_OR_RETURN(filtered_err_, OpenLog(opts_.filtered_stderr_file));
  }
  return absl::OkStatus();
}

// Spawns every worker; a worker that cannot start stops those already started (StartedWorkers).
// Warm workers are sent their go first and taken after, so that their standbys fork side by side.
absl::Status GroupRun::StartWorkers() {
  if (opts_.live) opts_.live->StartAttempt(launches_);
  std::vector<Pending> pending(launches_.size());
  for (size_t i = 0; i < launches_.size(); ++i) RETURN_IF_ERROR(PrepareSlot(i, &pending[i]));
  if (opts_.warm) RETURN_IF_ERROR(SendWarm(&pending));
  for (size_t i = 0; i < launches_.size(); ++i) {
    if (slots_[i].pid < 0) RETURN_IF_ERROR(SpawnCold(i, &pending[i]));
    Adopt(i, &pending[i]);
  }
  if (opts_.on_started) opts_.on_started();
  // Workers that report no steps: on_stepping once they have run for stepping_wait.
  if (opts_.on_stepping) stepping_timer_->Arm(opts_.stepping_wait);
  // An explicit --hang-timeout does nothing for workers that report no steps: said once.
  if (opts_.hang.timeout && opts_.hang.timeout->count() > 0) no_steps_timer_->Arm(*opts_.hang.timeout);
  return absl::OkStatus();
}

// A worker's logs, line relays and stdin.
absl::Status GroupRun::PrepareSlot(size_t i, Pending* p) {
  const WorkerLaunch& l = launches_[i];
  Slot& s = slots_[i];
  s.launch = &l;
  s.result.local_rank = l.local_rank;
  s.result.rank = l.rank;
  ASSIGN_OR_RETURN(s.out_file, OpenLog(l.stdout_file));
  ASSIGN_OR_RETURN(s.err_file, OpenLog(l.stderr_file));
  const std::string prefix = l.console_prefix ? *l.console_prefix
                                              : absl::StrReplaceAll(opts_.console_prefix_format,
                                                                    {{"{rank}", std::to_string(l.rank)}});
  s.merged = opts_.one_console && l.stdout_console && l.stderr_console && l.stdout_file.empty() &&
             l.stderr_file.empty() && opts_.stdout_filters.empty() && opts_.stderr_filters.empty();
  s.out.console = l.stdout_console ? console_out_ : nullptr;
  s.err.console = l.stderr_console ? console_err_ : nullptr;
  s.out.relay = std::make_unique<LineRelay>(LineRelay::Options{prefix, s.out.console, s.out_file.get(),
                                                               s.merged ? opts_.stderr_tail_lines : 0,
                                                               &opts_.stdout_filters, filtered_out_.get()});
  s.err.relay = std::make_unique<LineRelay>(LineRelay::Options{prefix, s.err.console, s.err_file.get(),
                                                               opts_.stderr_tail_lines, &opts_.stderr_filters,
                                                               filtered_err_.get()});
  p->stdin_fd = dev_null_.get();
  std::optional<StdinRelay::Pty> pty;
  if (l.reads_stdin && s.merged) pty = stdin_relay_->OpenPty(STDOUT_FILENO);
  if (pty) {
    p->pty_master = std::move(pty->master);
    p->pty_slave = std::move(pty->slave);
    p->stdin_fd = p->pty_slave.get();
  } else if (l.reads_stdin && stdin_relay_->active()) {
    if (!MakePipe(&p->in)) return ErrnoStatus("pipe");
    p->stdin_fd = p->in.read.get();
  } else if (l.reads_stdin) {
    p->stdin_fd = opts_.stdin_fd;
  }
  return absl::OkStatus();
}

// Sends each warm standby its go. Every go sent is taken, even when a later worker's pipes cannot
// be made: a worker forked and not taken would be nobody's. A warm worker's write ends are closed
// once its standby has them, so that launch holds no more descriptors at once than one worker's
// spawn needs.
absl::Status GroupRun::SendWarm(std::vector<Pending>* pending) {
  for (size_t i = 0; i < launches_.size(); ++i) {
    Pending& p = (*pending)[i];
    if (p.pty_slave.valid()) continue;  // a standby's worker cannot take a controlling terminal
    if (!MakePipe(&p.out) || (!slots_[i].merged && !MakePipe(&p.err))) {
      const absl::Status st = ErrnoStatus("pipe");
      TakeSent(pending);
      return st;
    }
    const int err_write = slots_[i].merged ? p.out.write.get() : p.err.write.get();
    p.sent = opts_.warm->Send(launches_[i], {progress_write_.get(), p.stdin_fd, p.out.write.get(), err_write});
    p.out.write.Reset();
    p.err.write.Reset();
    if (!p.sent) {
      p.out.read.Reset();
      p.err.read.Reset();
    }
  }
  TakeSent(pending);
  return absl::OkStatus();
}

void GroupRun::TakeSent(std::vector<Pending>* pending) {
  for (size_t i = 0; i < launches_.size(); ++i) {
    Pending& p = (*pending)[i];
    if (!p.sent) continue;
    p.sent = false;
    if (std::optional<pid_t> pid = opts_.warm->Take(launches_[i])) {
      slots_[i].pid = *pid;
      // Its run time counts from its fork, as a cold worker's from its spawn: not from a wait
      // for its own or another rank's standby to get ready.
      slots_[i].start = clock_->Now();
    } else {
      p.out.read.Reset();  // cold, through new pipes
      p.err.read.Reset();
    }
  }
}

absl::Status GroupRun::SpawnCold(size_t i, Pending* p) {
  const WorkerLaunch& l = launches_[i];
  if (p->pty_slave.valid()) {
    // Its terminal's master side is read as its output and written with launch's keys.
    p->out.read.Reset(::fcntl(p->pty_master.get(), F_DUPFD_CLOEXEC, 0));
    if (!p->out.read.valid()) return ErrnoStatus("dup");
  } else if (!MakePipe(&p->out) || (!slots_[i].merged && !MakePipe(&p->err))) {
    return ErrnoStatus("pipe");
  }
  slots_[i].start = clock_->Now();
  SpawnOptions so;
  so.cpus = l.cpus;
  so.preferred_memory_node = l.memory_node;
  so.stdin_fd = p->stdin_fd;
  so.argv = l.argv;
  so.env = l.env;
  so.stdout_fd = p->out.write.get();
  so.stderr_fd = slots_[i].merged ? p->out.write.get() : p->err.write.get();
  if (p->pty_slave.valid()) {
    so.stdout_fd = so.stderr_fd = p->pty_slave.get();
    so.controlling_terminal = true;
  }
  so.extra_fd = progress_write_.get();
  so.extra_fd_target = launch_sdk::kProgressFd;
  // Registered by the child itself before exec: a launch killed right after a worker started
  // (before it could register the group here) left that worker's children running.
  so.guard_fd = guard_ ? guard_->fd() : -1;
  ASSIGN_OR_RETURN(slots_[i].pid, launcher_->Spawn(so));
  return absl::OkStatus();
}

// A started worker, warm or cold: its pipes read from now on, its exit notice watched, and the
// ones who want to know told.
void GroupRun::Adopt(size_t i, Pending* p) {
  Slot& s = slots_[i];
  p->out.write.Reset();
  p->err.write.Reset();
  s.out.fd = std::move(p->out.read);
  s.err.fd = std::move(p->err.read);
  s.result.pid = s.pid;
  AddStoppableGroup(s.pid, p->pty_master.valid());  // Ctrl-Z and fg reach it through launch
  if (opts_.live) opts_.live->Spawned(i, s.pid);
  if (opts_.on_spawned) opts_.on_spawned(s.result);
  if (opts_.exit_notices) opts_.exit_notices->Watch(launches_[i].local_rank, s.pid);
  ++state_.running;
  if (p->in.write.valid()) stdin_relay_->SetWorker(std::move(p->in.write));
  p->in.read.Reset();
  if (p->pty_master.valid()) stdin_relay_->SetWorkerTerminal(std::move(p->pty_master));
  p->pty_slave.Reset();
  WatchOutput(&s.out);
  if (s.err.fd.valid()) WatchOutput(&s.err);
}

void GroupRun::WatchOutput(OutputPipe* pipe) {
  ::fcntl(pipe->fd.get(), F_SETFL, O_NONBLOCK);
  loop_->Watch(pipe->fd.get(), EPOLLIN, [this, pipe](uint32_t) { Drain(pipe, false); });
}

absl::Status GroupRun::Turn() {
  CheckGroups();
  if (done()) return absl::OkStatus();
  BeforeWait();
  return loop_->RunOnce();
}

// Events queue, and are taken in order: an action can lead to an event (captures that need no
// process are done at once).
void GroupRun::Apply(const SupervisorEvent& first) {
  events_due_.push_back(first);
  if (applying_) return;
  applying_ = true;
  while (!events_due_.empty()) {
    const SupervisorEvent event = events_due_.front();
    events_due_.pop_front();
    const SupervisorStep step = Supervise(opts_.stop, state_, event);
    state_ = step.state;
    RunActions(step.actions);
  }
  applying_ = false;
}

void GroupRun::RunActions(const SupervisorActions& a) {
  if (!a.warning.empty()) spdlog::warn("{}", a.warning);
  if (a.capture_stacks) {
    stacks_captured_ = true;
    captures_.Start(slots_, launcher_, opts_.hang.debugger);
    captures_.Poll();  // the sizes the files start at
    if (captures_.polling()) stack_poll_timer_->Arm(kStackFilePoll);
    if (captures_.done()) events_due_.push_back(CapturesDone());
  }
  if (a.signal_groups) {
    for (Slot& s : slots_)
      if (s.pid > 0 && !s.group_gone) launcher_->SignalGroup(s.pid, a.signal_groups);
  }
  if (a.arm_grace) grace_timer_->Arm(*a.arm_grace);
  if (a.report_failure >= 0 && opts_.on_failure) opts_.on_failure(slots_[a.report_failure].result);
}

// The captures are done: the hung worker is the one the stacks show outside a collective when the
// one first silent waits in one.
SupervisorEvent GroupRun::CapturesDone() {
  std::vector<std::vector<std::string>> frames(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].launch && slots_[i].last_progress) frames[i] = WorkerFrames(*slots_[i].launch);
  }
  const int first = state_.hung;
  const int hung = BlameFromStacks(first, frames);
  if (hung != first) {
    WorkerResult& was = slots_[first].result;
    WorkerResult& is = slots_[hung].result;
    spdlog::warn("rank {} waits in a collective, rank {} does not: rank {} is the hung one", was.rank, is.rank,
                 is.rank);
    is.hung_after_seconds = was.hung_after_seconds;
    was.hung = false;
    is.hung = true;
  }
  if (hung >= 0) {
    slots_[hung].result.stack_top = TopFrames(frames[hung], 3);
    slots_[hung].result.in_collective = WaitsInCollective(frames[hung]);
  }
  return SupervisorEvent::CapturesDone(hung);
}

// A process of Python's multiprocessing that ends by itself once the worker that made it has:
// the forkserver (and the pool workers forked from it) and the resource or semaphore tracker.
bool IsPythonHelper(const std::string& command_line) {
  for (const char* helper :
       {"from multiprocessing.forkserver import main", "from multiprocessing.resource_tracker import main",
        "from multiprocessing.semaphore_tracker import main"}) {
    if (absl::StrContains(command_line, helper)) return true;
  }
  return false;
}

// Once every worker is reaped: done when nothing is left in their process groups.
void GroupRun::CheckGroups() {
  if (state_.running != 0) return;
  bool any_alive = false;
  for (Slot& s : slots_) {
    if (!s.group_gone && !launcher_->GroupAlive(s.pid)) s.group_gone = true;
    if (s.group_gone) continue;
    any_alive = true;
    if (state_.phase == Phase::kRunning) {
      // multiprocessing's helpers end by themselves a moment after the worker: stopped all the
      // same, but not worth a warning.
      const std::optional<std::vector<std::string>> left = launcher_->GroupCommandLines(s.pid);
      if (left && std::all_of(left->begin(), left->end(), IsPythonHelper)) {
        spdlog::debug("rank {} left only exited processes or multiprocessing's helpers in its group {}; stopping them",
                      s.result.rank, s.pid);
      } else {
        spdlog::warn("rank {} exited but left processes in its group {}; stopping them", s.result.rank, s.pid);
      }
    }
  }
  Apply(SupervisorEvent::GroupsChecked(!any_alive));
}

void GroupRun::BeforeWait() {
  for (Slot& s : slots_) {
    for (OutputPipe* pipe : {&s.out, &s.err}) {
      const bool want = !(pipe->console && pipe->console->backlogged());
      if (!pipe->fd.valid() || pipe->reading == want) continue;
      loop_->Modify(pipe->fd.get(), want ? static_cast<uint32_t>(EPOLLIN) : 0u);
      pipe->reading = want;
    }
  }
  stdin_relay_->Update();
  ShowDuePartials();
}

// A line left unfinished for a moment (a prompt) is shown as far as it goes.
void GroupRun::ShowDuePartials() {
  const Clock::TimePoint now = clock_->Now();
  std::optional<Clock::TimePoint> next;
  for (Slot& s : slots_) {
    for (OutputPipe* pipe : {&s.out, &s.err}) {
      const std::optional<Clock::TimePoint> due = pipe->relay ? pipe->relay->partial_due() : std::nullopt;
      if (!due) continue;
      if (*due <= now) {
        pipe->relay->ShowPartial();
      } else if (!next || *due < *next) {
        next = due;
      }
    }
  }
  if (next) {
    partial_timer_->Arm(*next - now);
  } else {
    partial_timer_->Disarm();
  }
}

void GroupRun::OnSignals() {
  while (int sig = signals_->Read()) {
    if (sig == SIGCHLD) {
      Reap();
    } else {
      Apply(SupervisorEvent::Signal(sig));
    }
  }
}

void GroupRun::OnExitNotices() {
  // A signal launch got first is taken first (a scheduler's SIGTERM to every process of the job
  // reaches the workers too: their notices must not make it a failure).
  OnSignals();
  for (const ExitNotices::Notice& notice : opts_.exit_notices->Take()) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.pid != notice.pid || s.reaped || s.result.exit_noticed) continue;
      s.result.exit_noticed = true;
      SetStatus(&s, WIFEXITED(notice.status) ? WEXITSTATUS(notice.status) : 0,
                WIFSIGNALED(notice.status) ? WTERMSIG(notice.status) : 0);
      if (!s.result.failed()) continue;
      spdlog::debug("rank {} (pid {}) is exiting ({}), seen from its exit notice", s.result.rank, s.pid,
                    s.result.StatusText());
      Apply(SupervisorEvent::Failing(static_cast<int>(i)));
    }
  }
}

// Progress records and stack-dump offers share the socket; size and magic tell them apart.
void GroupRun::OnProgress() {
  alignas(8) char datagram[64];
  ssize_t got;
  while ((got = ::recv(progress_read_.get(), datagram, sizeof datagram, 0)) >= 0) {
    launch_sdk::ProgressRecord rec;
    launch_sdk::StackDumpRecord offer;
    if (got == static_cast<ssize_t>(sizeof rec) || got == static_cast<ssize_t>(launch_sdk::kProgressRecordV1Bytes)) {
      std::memcpy(&rec, datagram, static_cast<size_t>(got));  // a first-version record: no wait time
      if (rec.magic == launch_sdk::ProgressRecord{}.magic || rec.magic == launch_sdk::kCountedProgressMagic) {
        OnProgressRecord(rec, rec.magic == launch_sdk::kCountedProgressMagic);
      }
    } else if (got == static_cast<ssize_t>(sizeof offer)) {
      std::memcpy(&offer, datagram, sizeof offer);
      if (offer.magic != launch_sdk::StackDumpRecord{}.magic || offer.signal <= 0 || offer.signal >= 65) continue;
      for (Slot& s : slots_)
        if (s.result.rank == offer.rank) s.stack_signal = offer.signal;
    }
  }
  const auto reported = [](const Slot& s) { return s.last_progress.has_value(); };
  if (std::all_of(slots_.begin(), slots_.end(), reported)) {
    TellStepping();
  } else if (std::any_of(slots_.begin(), slots_.end(), reported)) {
    stepping_timer_->Disarm();  // the workers report steps: on_stepping waits for every one of them
  }
}

void GroupRun::OnProgressRecord(const launch_sdk::ProgressRecord& rec, bool counted) {
  const Clock::TimePoint now = clock_->Now();
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.result.rank != rec.rank || (counted && s.named_steps)) continue;
    if (!counted && !s.named_steps) {
      s.named_steps = true;  // its own step numbers and times from now on
      s.step_seconds.clear();
    }
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
}

// Level-triggered and never drained: seen once, then out of the set.
void GroupRun::OnCoordinatorStop() {
  loop_->Unwatch(opts_.stop_fd);
  Apply(SupervisorEvent::CoordinatorStop(opts_.stop_wants_stacks && opts_.stop_wants_stacks()));
}

// Reads what a worker wrote: one read per turn while it runs (level-triggered: others speak too),
// everything once the group is over.
void GroupRun::Drain(OutputPipe* pipe, bool final) {
  while (pipe->fd.valid()) {
    ssize_t n = ::read(pipe->fd.get(), buf_, sizeof buf_);
    if (n > 0) {
      pipe->relay->Feed(buf_, static_cast<size_t>(n), clock_->Now());
      if (!final) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN && !final) return;
    pipe->relay->Flush();  // EOF (or nothing more to expect)
    loop_->Unwatch(pipe->fd.get());
    pipe->fd.Reset();
  }
}

// How a worker ended (or, from its exit notice, is ending), and its error file's message.
void GroupRun::SetStatus(Slot* s, int exit_code, int signal) {
  s->result.exit_code = exit_code;
  s->result.signal = signal;
  if (s->result.failed()) {
    if (auto info = ReadErrorFile(s->launch->error_file); info.ok()) s->result.error_message = info->message;
  }
}

void GroupRun::Reap() {
  while (std::optional<ChildExit> exit = launcher_->ReapAny()) {
    if (captures_.Reaped(exit->pid)) {
      if (captures_.done() && state_.phase == Phase::kCapturing) Apply(CapturesDone());
      continue;
    }
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.pid != exit->pid || s.reaped) continue;
      s.reaped = true;
      if (opts_.live) opts_.live->Exited(i);
      const Clock::TimePoint now = clock_->Now();
      s.result.ended = now;
      s.result.run_seconds = SecondsBetween(s.start, now);
      SetStatus(&s, exit->exit_code, exit->signal);
      Apply(SupervisorEvent::Exited(static_cast<int>(i), s.result.failed()));
    }
    // Anything else is a worker's orphaned child, reparented to us (a subreaper): just reaped.
  }
}

void GroupRun::CheckHangs() {
  hang_timer_->Arm(opts_.hang.CheckPeriod());
  if (state_.phase != Phase::kRunning) return;
  // Launch and its workers were stopped (Ctrl-Z) and continued: the time stopped is no silence.
  if (const uint64_t continued = ContinuedCount(); continued != continued_seen_) {
    continued_seen_ = continued;
    for (Slot& s : slots_)
      if (s.last_progress) s.last_progress = clock_->Now();
    return;
  }
  std::vector<ProgressSeen> seen(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    seen[i] = {!slots_[i].reaped, slots_[i].last_progress, Median(slots_[i].step_seconds), !slots_[i].named_steps};
  }
  const std::optional<HungWorker> hung = FindHung(opts_.hang, seen, clock_->Now());
  if (!hung) return;
  Slot& s = slots_[hung->worker];
  s.result.hung = true;
  s.result.hung_after_seconds = hung->silent_seconds;
  spdlog::warn(
      "rank {} (pid {}) reported no step for {:.1f} s (last step {}, hang timeout {:.1f} s): hung; "
      "capturing every worker's stacks, then stopping them",
      s.result.rank, s.pid, s.result.hung_after_seconds, s.result.last_step, hung->timeout.count() / 1000.0);
  Apply(SupervisorEvent::Hung(hung->worker));
}

void GroupRun::SayNoSteps() {
  static std::atomic<bool> said{false};
  const auto reported = [](const Slot& s) { return s.last_progress.has_value(); };
  if (state_.phase != Phase::kRunning || std::any_of(slots_.begin(), slots_.end(), reported) || said.exchange(true)) {
    return;
  }
  spdlog::warn(
      "--hang-timeout={:g}: no rank has reported a step in that time, so none can be found hung; report steps with "
      "launch_progress (Python), worker_sdk's ProgressReporter, or run Python workers warm (their optimizer steps "
      "count)",
      opts_.hang.timeout->count() / 1000.0);
}

void GroupRun::TellStepping() {
  stepping_timer_->Disarm();
  if (stepping_told_ || !opts_.on_stepping) return;
  stepping_told_ = true;
  opts_.on_stepping();
}

void GroupRun::PollStackFiles() {
  captures_.Poll();
  if (captures_.done() && state_.phase == Phase::kCapturing) Apply(CapturesDone());
  if (captures_.polling()) stack_poll_timer_->Arm(kStackFilePoll);
}

GroupOutcome GroupRun::Finish() {
  captures_.KillLeft(launcher_);
  // A hung worker whose stacks came too late for the capture still gets the frames that came.
  if (state_.hung >= 0 && slots_[state_.hung].result.stack_top.empty() && slots_[state_.hung].launch) {
    slots_[state_.hung].result.stack_top = TopFrames(WorkerFrames(*slots_[state_.hung].launch), 3);
  }
  GroupOutcome outcome;
  outcome.stacks_captured = stacks_captured_;
  outcome.kind = state_.end;
  outcome.signal = state_.end == GroupEnd::kInterrupted ? state_.signal : 0;
  outcome.root_cause = state_.end == GroupEnd::kFailed ? state_.root_cause : -1;
  for (Slot& s : slots_) {
    Drain(&s.out, true);
    Drain(&s.err, true);
    s.result.stderr_tail = (s.merged ? s.out.relay : s.err.relay)->tail();
    started_.Unregister(s);
    outcome.workers.push_back(s.result);
  }
  return outcome;
}

}  // namespace

absl::StatusOr<GroupOutcome> WorkerGroup::Run(const std::vector<WorkerLaunch>& launches) {
  GroupRun run(opts_, launcher_, guard_, signals_, clock_, launches);
  RETURN_IF_ERROR(run.Open());
  RETURN_IF_ERROR(run.StartWorkers());
  while (!run.done()) RETURN_IF_ERROR(run.Turn());
  return run.Finish();
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
