#include "agent/group_supervisor.h"

#include <algorithm>
#include <csignal>

#include "absl/strings/str_cat.h"
#include "probes/process.h"

namespace launch {

StopEscalation StopEscalation::TermThenKill(std::chrono::milliseconds grace) {
  return StopEscalation{{{SIGTERM, grace}, {SIGKILL, std::chrono::milliseconds(0)}}};
}

const char* SupervisorPhaseName(SupervisorState::Phase p) {
  switch (p) {
    case SupervisorState::Phase::kRunning:
      return "running";
    case SupervisorState::Phase::kCapturing:
      return "capturing";
    case SupervisorState::Phase::kStopping:
      return "stopping";
    case SupervisorState::Phase::kDone:
      return "done";
  }
  return "?";
}

namespace {

using Phase = SupervisorState::Phase;
using Kind = SupervisorEvent::Kind;

// Takes the first stop step, sending `first_signal` (the step's own, or the signal launch got).
void BeginStop(const StopEscalation& stop, GroupEnd end, int first_signal, SupervisorStep* out) {
  out->state.phase = Phase::kStopping;
  out->state.end = end;
  out->state.next_step = 1;
  out->actions.signal_groups = first_signal;
  if (stop.steps.size() > 1) out->actions.arm_grace = stop.steps[0].grace;
}

int FirstSignal(const StopEscalation& stop) { return stop.steps.empty() ? SIGKILL : stop.steps.front().signal; }
int LastSignal(const StopEscalation& stop) { return stop.steps.empty() ? SIGKILL : stop.steps.back().signal; }

// One handler per event kind, each total over the phases before kDone: `out` starts as the state
// unchanged with no actions.

// A worker was reaped, or says it is exiting with a failure (its failed exit, seen sooner: it runs
// until it is reaped). The first failure while running is the root cause.
void OnWorkerEnded(const StopEscalation& stop, const SupervisorEvent& event, SupervisorStep* out) {
  SupervisorState& s = out->state;
  if (event.kind == Kind::kWorkerExited && s.running > 0) --s.running;
  if (s.phase == Phase::kRunning && event.failed) {
    s.root_cause = event.worker;
    BeginStop(stop, GroupEnd::kFailed, FirstSignal(stop), out);
    out->actions.report_failure = event.worker;
  }
}

void OnSignal(const StopEscalation& stop, const SupervisorEvent& event, SupervisorStep* out) {
  SupervisorState& s = out->state;
  if (s.phase == Phase::kRunning || s.phase == Phase::kCapturing) {
    s.signal = event.signal;
    BeginStop(stop, GroupEnd::kInterrupted, event.signal, out);  // forwarded as it came
    out->actions.warning = absl::StrCat("got ", SignalName(event.signal),
                                        ": forwarding it to the workers (again to kill at once)");
    return;
  }
  // The first forwarded signal said "again to kill at once": a second one of any kind does, and so
  // does a Ctrl-C while a failure stops the group.
  const bool again = s.end == GroupEnd::kInterrupted;
  if (!again) {
    s.end = GroupEnd::kInterrupted;
    s.signal = event.signal;
  }
  if (again || event.signal == SIGINT) {
    out->actions.signal_groups = LastSignal(stop);
    out->actions.warning = absl::StrCat(SignalName(event.signal), " while stopping: killing the workers now");
    s.next_step = stop.steps.size();
  }
}

void OnCoordinatorStop(const StopEscalation& stop, const SupervisorEvent& event, SupervisorStep* out) {
  SupervisorState& s = out->state;
  if (s.phase == Phase::kRunning && event.failed) {  // a rank hung elsewhere: stacks first
    s.phase = Phase::kCapturing;
    s.end = GroupEnd::kCoordinatorStop;
    out->actions.capture_stacks = true;
    out->actions.arm_grace = stop.capture_grace;
    return;
  }
  if (s.phase == Phase::kRunning) BeginStop(stop, GroupEnd::kCoordinatorStop, FirstSignal(stop), out);
  // While capturing, the stop comes once the stacks are taken: stopping now would kill the workers
  // under the debugger (another node's hang report often arrives at this moment).
}

void OnHung(const StopEscalation& stop, const SupervisorEvent& event, SupervisorStep* out) {
  SupervisorState& s = out->state;
  if (s.phase != Phase::kRunning) return;  // already stopping: nothing more to learn
  s.phase = Phase::kCapturing;
  s.end = GroupEnd::kFailed;
  s.root_cause = event.worker;
  s.hung = event.worker;
  out->actions.capture_stacks = true;
  out->actions.arm_grace = stop.capture_grace;
}

void OnCapturesDone(const StopEscalation& stop, const SupervisorEvent& event, SupervisorStep* out) {
  SupervisorState& s = out->state;
  if (s.phase != Phase::kCapturing) return;
  if (event.worker >= 0 && s.hung >= 0) s.root_cause = s.hung = event.worker;
  BeginStop(stop, s.end, FirstSignal(stop), out);
  out->actions.report_failure = s.hung;  // as the stacks name it (-1: not this node's)
}

// The grace of the step taken last ran out: the next step, the last one repeated once the steps
// are spent.
void TakeNextStep(const StopEscalation& stop, SupervisorStep* out) {
  SupervisorState& s = out->state;
  const size_t last = stop.steps.empty() ? 0 : stop.steps.size() - 1;
  const size_t step = std::min(s.next_step, last);
  const int sig = stop.steps.empty() ? SIGKILL : stop.steps[step].signal;
  out->actions.signal_groups = sig;
  if (step > 0) {
    out->actions.warning = absl::StrCat("workers still running ", stop.steps[step - 1].grace.count(), " ms after ",
                                        SignalName(stop.steps[step - 1].signal), ": sending ", SignalName(sig));
  }
  if (step < last) out->actions.arm_grace = stop.steps[step].grace;
  s.next_step = step + 1;
}

void OnGraceOver(const StopEscalation& stop, SupervisorStep* out) {
  SupervisorState& s = out->state;
  if (s.phase == Phase::kCapturing) {  // the captures took too long: stop without them
    BeginStop(stop, s.end, FirstSignal(stop), out);
    out->actions.report_failure = s.hung;
    out->actions.warning = absl::StrCat("capturing the stacks took over ", stop.capture_grace.count(),
                                        " ms: stopping the workers without the rest");
    return;
  }
  if (s.phase != Phase::kStopping) return;  // a timer that fired as the stop ended
  TakeNextStep(stop, out);
}

void OnGroupsChecked(const StopEscalation& stop, const SupervisorEvent& event, SupervisorStep* out) {
  SupervisorState& s = out->state;
  if (s.running > 0) return;
  if (event.groups_empty) {
    s.phase = Phase::kDone;
  } else if (s.phase == Phase::kRunning) {
    // Every worker exited but processes are left in their groups: they would be orphans. (The shell
    // names the groups, which it knows.)
    BeginStop(stop, s.end, FirstSignal(stop), out);
  }
}

}  // namespace

SupervisorStep Supervise(const StopEscalation& stop, const SupervisorState& state, const SupervisorEvent& event) {
  SupervisorStep out{state, {}};
  if (state.phase == Phase::kDone) return out;  // nothing is left to supervise
  switch (event.kind) {
    case Kind::kWorkerExited:
    case Kind::kWorkerFailing:
      OnWorkerEnded(stop, event, &out);
      break;
    case Kind::kSignal:
      OnSignal(stop, event, &out);
      break;
    case Kind::kCoordinatorStop:
      OnCoordinatorStop(stop, event, &out);
      break;
    case Kind::kHung:
      OnHung(stop, event, &out);
      break;
    case Kind::kCapturesDone:
      OnCapturesDone(stop, event, &out);
      break;
    case Kind::kGraceOver:
      OnGraceOver(stop, &out);
      break;
    case Kind::kGroupsChecked:
      OnGroupsChecked(stop, event, &out);
      break;
  }
  return out;
}

}  // namespace launch
