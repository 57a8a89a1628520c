// The node agent's life as a pure state machine: join a round, run the workers, report how they
// ended, then wait for the other nodes, back off and re-join, or end. Each phase's work (a join, a
// group run, a report) is done by the Agent, which feeds what happened back as an event; what
// comes next is decided here only, and tested as a table.
#pragma once

#include "agent/group_supervisor.h"

namespace launch {

enum class AgentPhase {
  kJoining,     // waiting for a rendezvous round
  kRunning,     // this node's workers run
  kReporting,   // telling the coordinator how they ended, for its verdict
  kAwaiting,    // this node's workers succeeded; the other nodes' have not all ended
  kBackingOff,  // --restart-backoff before the next round
  kDone,
};

// How the agent's run ended (kDone), which decides what it prints and its exit code.
enum class AgentEnd {
  kNone,
  kSucceeded,    // the whole job succeeded: exit 0
  kDryRun,       // the plan was printed: exit 0
  kSignal,       // launch was stopped by a signal: 128 + signal
  kLaunchError,  // launch itself could not go on (coordinator gone, cannot spawn): exit 1
  kBadInput,     // the workers' environment cannot be built from the input: exit 2
  kJobFailed,    // the job failed, first elsewhere or as the coordinator decided: its first failure's code
  kGaveUp,       // this node's workers failed and no restart is left: the root cause's code and summary
};

struct AgentState {
  AgentPhase phase = AgentPhase::kJoining;
  GroupEnd last_end = GroupEnd::kSucceeded;  // how the last attempt's workers ended
  // A report after waiting for the others: it only asks the job's verdict (with its first failure).
  bool asking = false;
  AgentEnd end = AgentEnd::kNone;
  int signal = 0;  // kSignal
};

// The coordinator's answer to a report or to the wait for the other nodes.
enum class Verdict {
  kGoOn,       // nothing ended: the job and its round go on
  kNewRound,   // a new round forms: re-join (after this node's failure, back off first)
  kSucceeded,  // the whole job succeeded
  kFailed,     // the job failed; no new round comes
};

// The wire's booleans (ReportExitResponse's, or a heartbeat's with stop_workers as `new_round`)
// as one verdict: an end outranks a new round, and success outranks failure.
Verdict VerdictFrom(bool job_succeeded, bool job_failed, bool new_round);

struct AgentEvent {
  enum class Kind {
    kAssigned,     // kJoining: the round formed
    kDryRun,       // kRunning: the workers' plan was printed instead of run
    kGroupEnded,   // kRunning: the workers ended as `group_end`
    kVerdict,      // kReporting / kAwaiting: the coordinator answered with `verdict`
    kNoVerdict,    // kReporting / kAwaiting: no answer (unreachable past patience, or refused)
    kBackoffOver,  // kBackingOff
    kSignal,       // any phase: launch got `signal` (the group handles its own while it runs)
    kError,        // any phase: launch itself cannot go on
    kBadInput,     // kRunning: the workers' environment cannot be built
  };
  Kind kind = Kind::kError;
  GroupEnd group_end = GroupEnd::kSucceeded;
  Verdict verdict = Verdict::kGoOn;
  int signal = 0;  // kSignal; kGroupEnded with kInterrupted
  // kGroupEnded with kCoordinatorStop: the coordinator hosted by another node's agent stayed
  // unreachable past the patience (that node is gone, and the job with it).
  bool coordinator_gone = false;

  static AgentEvent Of(Kind k) { return AgentEvent{k, GroupEnd::kSucceeded, Verdict::kGoOn, 0, false}; }
  static AgentEvent GroupEnded(GroupEnd e, int sig = 0, bool coordinator_gone = false) {
    return AgentEvent{Kind::kGroupEnded, e, Verdict::kGoOn, sig, coordinator_gone};
  }
  static AgentEvent Answered(Verdict v) { return AgentEvent{Kind::kVerdict, GroupEnd::kSucceeded, v, 0, false}; }
  static AgentEvent Signal(int sig) {
    return AgentEvent{Kind::kSignal, GroupEnd::kSucceeded, Verdict::kGoOn, sig, false};
  }
};

// The one transition function. It is total: an event that cannot come in a phase (a verdict while
// joining) ends the run as launch's own error rather than being ignored, so no move is undefined.
AgentState NextAgentState(const AgentState& state, const AgentEvent& event);

const char* AgentPhaseName(AgentPhase p);

}  // namespace launch
