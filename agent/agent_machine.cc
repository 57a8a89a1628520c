#include "agent/agent_machine.h"

namespace launch {

const char* AgentPhaseName(AgentPhase p) {
  switch (p) {
    case AgentPhase::kJoining:
      return "joining";
    case AgentPhase::kRunning:
      return "running";
    case AgentPhase::kReporting:
      return "reporting";
    case AgentPhase::kAwaiting:
      return "awaiting";
    case AgentPhase::kBackingOff:
      return "backing off";
    case AgentPhase::kDone:
      return "done";
  }
  return "?";
}

Verdict VerdictFrom(bool job_succeeded, bool job_failed, bool new_round) {
  if (job_succeeded) return Verdict::kSucceeded;
  if (job_failed) return Verdict::kFailed;
  return new_round ? Verdict::kNewRound : Verdict::kGoOn;
}

namespace {

AgentState Done(AgentState s, AgentEnd end, int signal = 0) {
  s.phase = AgentPhase::kDone;
  s.end = end;
  s.signal = signal;
  return s;
}

AgentState Go(AgentState s, AgentPhase phase, bool asking = false) {
  s.phase = phase;
  s.asking = asking;
  return s;
}

// The coordinator answered this node's report about workers that ended as `s.last_end`.
AgentState AfterReport(const AgentState& s, Verdict v) {
  if (v == Verdict::kSucceeded) return Done(s, AgentEnd::kSucceeded);
  switch (s.last_end) {
    case GroupEnd::kFailed:
      // The local summary is printed either way; the job's first failure decides the code.
      return v == Verdict::kNewRound ? Go(s, AgentPhase::kBackingOff) : Done(s, AgentEnd::kGaveUp);
    case GroupEnd::kSucceeded:
      if (v == Verdict::kFailed) return Done(s, AgentEnd::kJobFailed);
      // Another node failed after ours succeeded, or (having waited) the job goes on: re-join.
      if (v == Verdict::kNewRound || s.asking) return Go(s, AgentPhase::kJoining);
      return Go(s, AgentPhase::kAwaiting);
    case GroupEnd::kCoordinatorStop:
      return v == Verdict::kFailed ? Done(s, AgentEnd::kJobFailed) : Go(s, AgentPhase::kJoining);
    case GroupEnd::kInterrupted:
      break;  // an interrupted group ends the run before any report
  }
  return Done(s, AgentEnd::kLaunchError);
}

}  // namespace

AgentState NextAgentState(const AgentState& s, const AgentEvent& e) {
  using K = AgentEvent::Kind;
  using P = AgentPhase;
  if (s.phase == P::kDone) return s;
  switch (e.kind) {
    case K::kSignal:
      return Done(s, AgentEnd::kSignal, e.signal);
    case K::kError:
      return Done(s, AgentEnd::kLaunchError);
    case K::kBadInput:
      return Done(s, s.phase == P::kRunning ? AgentEnd::kBadInput : AgentEnd::kLaunchError);
    case K::kAssigned:
      if (s.phase == P::kJoining) return Go(s, P::kRunning);
      break;
    case K::kDryRun:
      if (s.phase == P::kRunning) return Done(s, AgentEnd::kDryRun);
      break;
    case K::kGroupEnded:
      if (s.phase != P::kRunning) break;
      if (e.group_end == GroupEnd::kInterrupted) return Done(s, AgentEnd::kSignal, e.signal);
      if (e.group_end == GroupEnd::kCoordinatorStop && e.coordinator_gone) return Done(s, AgentEnd::kJobFailed);
      {
        AgentState next = Go(s, P::kReporting);
        next.last_end = e.group_end;
        return next;
      }
    case K::kVerdict:
      if (s.phase == P::kReporting) return AfterReport(s, e.verdict);
      if (s.phase == P::kAwaiting) {
        if (e.verdict == Verdict::kSucceeded) return Done(s, AgentEnd::kSucceeded);
        if (e.verdict == Verdict::kNewRound) return Go(s, P::kJoining);
        return Go(s, P::kReporting, /*asking=*/true);  // failed: ask for the verdict with its first failure
      }
      break;
    case K::kNoVerdict:
      if (s.phase == P::kAwaiting) return Go(s, P::kReporting, /*asking=*/true);
      if (s.phase == P::kReporting) {
        if (s.last_end == GroupEnd::kFailed) return Done(s, AgentEnd::kGaveUp);
        return Done(s, s.asking ? AgentEnd::kJobFailed : AgentEnd::kLaunchError);
      }
      break;
    case K::kBackoffOver:
      if (s.phase == P::kBackingOff) return Go(s, P::kJoining);
      break;
  }
  return Done(s, AgentEnd::kLaunchError);  // an event that cannot come in this phase
}

}  // namespace launch
