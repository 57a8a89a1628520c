// The launcher's signals as events: SIGCHLD and every signal launch can be asked to handle
// (--signals-to-handle) are blocked in every thread (call BlockLauncherSignals first thing in
// main) and read from one signalfd. SIGPIPE and SIGTTIN launch ignores (workers start with them
// at their defaults).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace launch {

// torchrun's --signals-to-handle default: what launch forwards to its workers before stopping.
std::vector<int> DefaultHandledSignals();
// What a Slurm job step adds to it: the signals `sbatch --signal=USR1@60` and `scancel
// --signal=USR2` send ahead of the time limit or a preemption.
std::vector<int> SlurmHandledSignals();
// "SIGTERM,SIGUSR1" (names with or without SIG, any case, or numbers) -> signal numbers, each
// one launch can handle; an error names the bad item and the signals accepted.
absl::StatusOr<std::vector<int>> ParseSignalList(const std::string& list);
// "SIGTERM,SIGINT".
std::string SignalListName(const std::vector<int>& signals);

void BlockLauncherSignals();

// Job control (Ctrl-Z, then fg or bg): the workers are in process groups of their own, which a
// terminal's SIGTSTP and the shell's SIGCONT do not reach. Once installed, a SIGTSTP to launch is
// sent on to every registered worker group before launch stops itself, and a SIGCONT to launch is
// sent on to them as it continues. Handlers, not the signalfd: every wait stays as it is.
void InstallJobControl();
// A worker's process group, from its start until it is gone (async-signal-safe lists; at most
// kMaxWorkersPerNode * 2 at once, more are not forwarded to).
// `own_session`: the group leads a session of its own (a worker on its own terminal), where the
// kernel drops a SIGTSTP (its group is orphaned): it is stopped with SIGSTOP.
void AddStoppableGroup(pid_t pgid, bool own_session = false);
void RemoveStoppableGroup(pid_t pgid);
// How many times launch has been continued after a stop (SIGCONT): a clock that jumped.
uint64_t ContinuedCount();

class SignalFd {
 public:
  // `handled`: the signals Read() returns (SIGCHLD always); any other signal launch blocks takes
  // its default action when it arrives (it ends launch), as for a program that does not handle it.
  static absl::StatusOr<SignalFd> Create(const std::vector<int>& handled = DefaultHandledSignals());
  int fd() const { return fd_.get(); }
  // The next pending signal number, or 0 when none is pending.
  int Read();
  // A handled signal (SIGCHLD aside) that has arrived and was not read yet, without reading it; 0
  // when none.
  int Pending() const;

 private:
  SignalFd(UniqueFd fd, unsigned long long handled) : fd_(std::move(fd)), handled_(handled) {}
  UniqueFd fd_;
  unsigned long long handled_;  // bit N: signal N
};

}  // namespace launch
