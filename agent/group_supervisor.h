// The worker group's supervision as a pure state machine: events in (a worker ended, launch got a
// signal, the coordinator wants the group stopped, a grace period ran out), the next state and the
// actions to take out. No processes, clocks or descriptors: WorkerGroup runs the actions.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/tunables.h"

namespace launch {

// One step of stopping the group: send `signal` to every worker's process group, then give them
// `grace` to end before the next step. The last step's grace is not used.
struct StopStep {
  int signal = 0;
  std::chrono::milliseconds grace{0};
};

// How a group is stopped (reproc's stop actions): by default SIGTERM, the grace, then SIGKILL.
// When launch itself is interrupted, the first step sends the signal launch got instead.
struct StopEscalation {
  std::vector<StopStep> steps;
  // A hung group's stacks are captured before the first step, for at most this long.
  std::chrono::milliseconds capture_grace = kCaptureStacksGrace;
  static StopEscalation TermThenKill(std::chrono::milliseconds grace);
};

// How the group ended (or is ending).
enum class GroupEnd { kSucceeded, kFailed, kInterrupted, kCoordinatorStop };

struct SupervisorState {
  enum class Phase {
    kRunning,    // workers run; nothing asked them to stop
    kCapturing,  // a worker hung: its group's stacks are being captured before the stop
    kStopping,   // stop steps are being taken (a failure, a signal, the coordinator, or leftovers)
    kDone,       // every worker reaped and every worker's process group empty
  };
  Phase phase = Phase::kRunning;
  GroupEnd end = GroupEnd::kSucceeded;
  int signal = 0;        // kInterrupted: the signal launch got
  int root_cause = -1;   // kFailed: the worker whose failure stopped the group
  int hung = -1;         // the worker that stopped making progress (then also the root cause)
  size_t next_step = 0;  // the escalation step the grace timer leads to
  int running = 0;       // workers not yet reaped
};

struct SupervisorEvent {
  enum class Kind {
    kWorkerExited,     // `worker` was reaped; `failed`: non-zero exit or killed
    kWorkerFailing,    // `worker` is exiting with a failure, not yet reaped (its exit notice)
    kSignal,           // launch got `signal` (SIGINT, SIGTERM, SIGHUP, SIGQUIT)
    kCoordinatorStop,  // another node failed, or a new round is forming
    kGraceOver,        // the grace of the last stop step ran out
    kGroupsChecked,    // every worker is reaped; `groups_empty`: nothing is left in their groups
    kHung,             // `worker` reported no step for longer than its hang timeout
    kCapturesDone,     // the stacks asked for are written (or could not be); `worker`: see below
  };
  Kind kind = Kind::kWorkerExited;
  int worker = -1;
  bool failed = false;  // kWorkerExited; kCoordinatorStop: capture the stacks first
  int signal = 0;
  bool groups_empty = false;

  static SupervisorEvent Exited(int worker, bool failed) { return {Kind::kWorkerExited, worker, failed, 0, false}; }
  static SupervisorEvent Failing(int worker) { return {Kind::kWorkerFailing, worker, true, 0, false}; }
  static SupervisorEvent Signal(int sig) { return {Kind::kSignal, -1, false, sig, false}; }
  // `capture`: the coordinator wants the stacks first (a rank hung on another node).
  static SupervisorEvent CoordinatorStop(bool capture = false) {
    return {Kind::kCoordinatorStop, -1, capture, 0, false};
  }
  static SupervisorEvent GraceOver() { return {Kind::kGraceOver, -1, false, 0, false}; }
  static SupervisorEvent GroupsChecked(bool empty) { return {Kind::kGroupsChecked, -1, false, 0, empty}; }
  static SupervisorEvent Hung(int worker) { return {Kind::kHung, worker, false, 0, false}; }
  // `worker`: the hung worker as the stacks show it (-1: the one first found silent).
  static SupervisorEvent CapturesDone(int worker = -1) { return {Kind::kCapturesDone, worker, false, 0, false}; }
};

// What the shell does after a step, in this order.
struct SupervisorActions {
  int signal_groups = 0;  // send this signal to every worker's process group that is not empty
  std::optional<std::chrono::milliseconds> arm_grace;  // (re)arm the grace timer
  int report_failure = -1;                             // tell the coordinator at once that this worker failed
  bool capture_stacks = false;                         // capture every live worker's stacks, then say kCapturesDone
  std::string warning;                                 // a line for launch's log
};

struct SupervisorStep {
  SupervisorState state;
  SupervisorActions actions;
};

// The one transition function. It is total: every event has a defined meaning in every phase (an
// event that changes nothing, such as a grace timer firing after the end, is a step with no
// actions), so there is no illegal move to reject.
SupervisorStep Supervise(const StopEscalation& stop, const SupervisorState& state, const SupervisorEvent& event);

const char* SupervisorPhaseName(SupervisorState::Phase p);

}  // namespace launch
