// launch's exit status, decided in one place: how a run (or a subcommand) ended maps to its code
// by one pure function, tested as a table. The contract (DESIGN.md, the README): 0 on success;
// the first failed worker's code (128 + signal when it was killed); 2 for usage and config
// errors; 128 + signal when launch itself was stopped by a signal.
#pragma once

namespace launch {

// How launch ended, as far as its exit status goes.
struct LaunchOutcome {
  enum class Kind {
    kSucceeded,     // every worker of the job exited 0, or a plan, help or version was printed
    kUsageError,    // bad flags, config, environment or input: 2
    kLaunchError,   // launch itself could not go on (spawn, rendezvous, coordinator): 1
    kJobFailed,     // the job failed and no worker's failure is known (only a reason): 1
    kSignalled,     // launch itself was stopped by `signal`: 128 + signal
    kWorkerFailed,  // a worker failed: its code, 128 + the signal that killed it, or kHungExitCode
  };
  Kind kind = Kind::kSucceeded;
  int signal = 0;     // kSignalled: the signal launch got; kWorkerFailed: the one that killed the worker
  int exit_code = 0;  // kWorkerFailed, without a signal
  bool hung = false;  // kWorkerFailed: its agent stopped it for making no progress

  static LaunchOutcome Succeeded() { return {Kind::kSucceeded, 0, 0, false}; }
  static LaunchOutcome UsageError() { return {Kind::kUsageError, 0, 0, false}; }
  static LaunchOutcome LaunchError() { return {Kind::kLaunchError, 0, 0, false}; }
  static LaunchOutcome JobFailed() { return {Kind::kJobFailed, 0, 0, false}; }
  static LaunchOutcome Signalled(int sig) { return {Kind::kSignalled, sig, 0, false}; }
  static LaunchOutcome WorkerFailed(int exit_code, int signal, bool hung = false) {
    return {Kind::kWorkerFailed, signal, exit_code, hung};
  }
};

// A hung worker's code, as timeout(1) exits when its command times out.
inline constexpr int kHungExitCode = 124;
inline constexpr int kUsageErrorExitCode = 2;

// The exit status of `launch` for `o`. A worker failure with neither code nor signal (a report
// that lost them) is still a failure: 1.
int ExitStatus(const LaunchOutcome& o);

}  // namespace launch
