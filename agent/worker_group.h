// One attempt of the local worker group: spawn every worker, relay its output, see exits as they
// happen (signalfd, no polling), stop the whole group on the first failure or on a signal
// (SIGTERM to each worker's process group, SIGKILL after the grace), and say how it ended. What to
// do on each event is decided by the pure GroupSupervisor and hang checks (hang_check.h); this is
// their shell: an event loop (common/event_loop.h) where each descriptor's owner handles its events.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "probes/console.h"
#include "agent/exit_notices.h"
#include "agent/group_supervisor.h"
#include "agent/hang_check.h"
#include "agent/live_ranks.h"
#include "probes/process.h"
#include "probes/signals.h"
#include "agent/worker_launch.h"
#include "common/clock.h"
#include "common/exit_status.h"
#include "common/tunables.h"
#include "common/unique_fd.h"

namespace launch {

struct WorkerResult {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;
  double run_seconds = 0;
  Clock::TimePoint ended{};
  std::string error_message;
  std::deque<std::string> stderr_tail;
  // The last progress report (worker_sdk's per-step call); last_step < 0: none came.
  int64_t last_step = -1;
  double last_loss = 0;
  double last_step_seconds = 0;
  // Stopped because it reported no step for longer than its hang timeout.
  bool hung = false;
  double hung_after_seconds = 0;       // how long it had been silent
  bool in_collective = false;          // a hung worker's stacks show it waiting in a collective
  std::vector<std::string> stack_top;  // a hung worker's top frames ("func (file:line)")
  // Its failing exit was seen from its exit notice, before it was reaped.
  bool exit_noticed = false;
  bool failed() const { return hung || signal != 0 || exit_code != 0; }
  // torchrun's meaning of a worker's status as a process exit code (common/exit_status.h): 0, its
  // code, 128 + the signal that killed it, or kHungExitCode for a hung worker.
  int AsExitCode() const { return failed() ? ExitStatus(LaunchOutcome::WorkerFailed(exit_code, signal, hung)) : 0; }
  // "exit 3", "SIGKILL" or "hung".
  std::string StatusText() const;
};

// The descriptors a worker gets: its progress socket (fd 3), stdin, stdout and stderr.
struct WorkerFds {
  int progress = -1, in = -1, out = -1, err = -1;
};

// Where a worker can come from other than a cold Spawn.
class WarmWorkers {
 public:
  virtual ~WarmWorkers() = default;
  // Gives the process made ready for worker `w` its environment and `fds` (which may be closed
  // once this returns): it starts the worker now. False: `w` starts cold (the reason is logged).
  // A group sends every worker its go before it takes any, so that they start side by side.
  virtual bool Send(const WorkerLaunch& w, const WorkerFds& fds) = 0;
  // The pid of worker `w`, sent its go: a child of launch, in a process group of its own as a
  // cold worker. nullopt: it starts cold (the reason is logged).
  virtual std::optional<pid_t> Take(const WorkerLaunch& w) = 0;
};

struct GroupOutcome {
  GroupEnd kind = GroupEnd::kSucceeded;
  int signal = 0;                // kInterrupted: the signal launch got
  int root_cause = -1;           // kFailed: index into workers of the first failure
  bool stacks_captured = false;  // the workers' stacks were captured before the stop
  std::vector<WorkerResult> workers;
};

class WorkerGroup {
 public:
  struct Options {
    // How the workers are stopped: SIGTERM, the grace (--stop-timeout), SIGKILL.
    StopEscalation stop = StopEscalation::TermThenKill(kDefaultStopTimeout);
    // Readable when the coordinator wants the group stopped (-1: none); then whether it wants the
    // workers' stacks first (a rank hung on another node).
    int stop_fd = -1;
    std::function<bool()> stop_wants_stacks;
    // Called as soon as a worker's failure is seen and the others are signalled (to tell the
    // coordinator at once).
    std::function<void(const WorkerResult&)> on_failure;
    // Where the workers' exit notices come (nullptr: none; a failure is seen as it is reaped).
    // The group watches each worker it starts, and nothing once it ends.
    ExitNotices* exit_notices = nullptr;
    // Called as each worker is spawned (its rank and pid set), before it can be reaped.
    std::function<void(const WorkerResult&)> on_spawned;
    // Workers made ready ahead (--warm-start; nullptr: every worker starts cold), and what to do
    // once every worker has started (make the next attempt's ready).
    WarmWorkers* warm = nullptr;
    std::function<void()> on_started;
    // Called once, when every worker has reported a step (worker_sdk's ProgressReporter): the
    // attempt trains. When no worker has reported one after stepping_wait (a program that
    // reports none), then.
    std::function<void()> on_stepping;
    std::chrono::milliseconds stepping_wait{10000};
    std::string console_prefix_format = "[{rank}]:";
    // torchrun's --duplicate-std{out,err}-filters: matching lines of every worker, prefixed, are
    // appended to these files (created when a filter is given).
    std::vector<std::string> stdout_filters, stderr_filters;
    std::string filtered_stdout_file, filtered_stderr_file;
    size_t stderr_tail_lines = 5;
    // Where shown output goes (nullptr: launch's ConsoleOut() / ConsoleErr()).
    ConsoleStream* console_out = nullptr;
    ConsoleStream* console_err = nullptr;
    // The two consoles are one file (2>&1, a terminal): a worker whose stdout and stderr both go
    // there only (no log files, no filters) writes both into one pipe, so its lines keep the order
    // it wrote them in, as under torchrun; its stderr tail is then its output's.
    bool one_console = false;
    // Hang detection from the workers' progress reports: a worker that has reported at least one
    // step and then none for its timeout is hung: every worker's stacks are captured, then the
    // group is stopped as for a failure, with that worker (or the one its stacks blame) as the
    // root cause.
    HangOptions hang;
    // Where the workers' pids, steps and exits are kept for the monitor (nullptr: nowhere).
    LiveRanks* live = nullptr;
    // launch's stdin. A terminal is relayed to the worker that reads it through a pipe, while
    // launch is in the terminal's foreground (a worker leads its own process group, so reading
    // the terminal itself would stop it with SIGTTIN); anything else it inherits.
    int stdin_fd = 0;
  };
  WorkerGroup(Options opts, ProcessLauncher* launcher, OrphanGuard* guard, SignalFd* signals, const Clock* clock)
      : opts_(std::move(opts)), launcher_(launcher), guard_(guard), signals_(signals), clock_(clock) {}

  // Runs to the end: every worker and every process of its group gone, output drained.
  absl::StatusOr<GroupOutcome> Run(const std::vector<WorkerLaunch>& workers);

 private:
  Options opts_;
  ProcessLauncher* launcher_;
  OrphanGuard* guard_;
  SignalFd* signals_;
  const Clock* clock_;
};

// "rank 1 (local 1, pid 42): exit 3"-style table of every failed worker, with error-file
// messages and stderr tails; `headline` is the first line.
std::string FailureSummary(const GroupOutcome& outcome, const std::string& headline);

}  // namespace launch
