// One attempt of the local worker group: spawn every worker, relay its output, see exits as they
// happen (signalfd, no polling), stop the whole group on the first failure or on a signal
// (SIGTERM to each worker's process group, SIGKILL after the grace), and say how it ended. What to
// do on each event is decided by the pure GroupSupervisor; this is its shell of descriptors.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/console.h"
#include "agent/group_supervisor.h"
#include "agent/process.h"
#include "agent/signals.h"
#include "common/clock.h"

namespace launch {

struct WorkerLaunch {
  int local_rank = 0;
  int rank = 0;
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string stdout_file, stderr_file;  // empty: no file
  bool stdout_console = true, stderr_console = true;
  std::string error_file;
  // This worker reads launch's stdin (global rank 0); the others read /dev/null.
  bool reads_stdin = false;
};

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
  bool failed() const { return signal != 0 || exit_code != 0; }
  // torchrun's meaning of a worker's status as a process exit code.
  int AsExitCode() const { return signal ? 128 + signal : exit_code; }
  // "exit 3" or "SIGKILL".
  std::string StatusText() const;
};

struct GroupOutcome {
  GroupEnd kind = GroupEnd::kSucceeded;
  int signal = 0;       // kInterrupted: the signal launch got
  int root_cause = -1;  // kFailed: index into workers of the first failure
  std::vector<WorkerResult> workers;
};

class WorkerGroup {
 public:
  struct Options {
    // How the workers are stopped: SIGTERM, the grace (--stop-timeout), SIGKILL.
    StopEscalation stop = StopEscalation::TermThenKill(std::chrono::seconds(30));
    // Readable when the coordinator wants the group stopped (-1: none).
    int stop_fd = -1;
    // Called as soon as a worker's failure is seen and the others are signalled (to tell the
    // coordinator at once).
    std::function<void(const WorkerResult&)> on_failure;
    std::string console_prefix_format = "[{rank}]:";
    size_t stderr_tail_lines = 5;
    // Where shown output goes (nullptr: launch's ConsoleOut() / ConsoleErr()).
    ConsoleStream* console_out = nullptr;
    ConsoleStream* console_err = nullptr;
    // launch's stdin. A terminal is relayed to the worker that reads it through a pipe, while
    // launch is in the terminal's foreground (a worker leads its own process group, so reading
    // the terminal itself would stop it with SIGTTIN); anything else it inherits.
    int stdin_fd = 0;
  };
  WorkerGroup(Options opts, ProcessLauncher* launcher, OrphanGuard* guard, SignalFd* signals,
              const Clock* clock)
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
