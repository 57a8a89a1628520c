#include <csignal>

#include "agent/agent_machine.h"
#include "agent/worker_group.h"

#include "gtest/gtest.h"

namespace launch {
namespace {

using P = AgentPhase;
using K = AgentEvent::Kind;

AgentState In(P phase, GroupEnd last_end = GroupEnd::kSucceeded, bool asking = false) {
  AgentState s;
  s.phase = phase;
  s.last_end = last_end;
  s.asking = asking;
  return s;
}

constexpr Verdict kGoOn = Verdict::kGoOn, kNewRound = Verdict::kNewRound, kSucceeded = Verdict::kSucceeded,
                  kFailed = Verdict::kFailed;

struct Move {
  const char* name;
  AgentState from;
  AgentEvent event;
  P to;
  AgentEnd end;  // when to == kDone
};

void PrintTo(const Move& m, std::ostream* os) { *os << m.name; }

class AgentMachineTable : public ::testing::TestWithParam<Move> {};

TEST_P(AgentMachineTable, Moves) {
  const Move& m = GetParam();
  const AgentState next = NextAgentState(m.from, m.event);
  EXPECT_EQ(next.phase, m.to) << AgentPhaseName(next.phase);
  if (m.to == P::kDone) EXPECT_EQ(static_cast<int>(next.end), static_cast<int>(m.end));
}

const AgentEvent kAssigned = AgentEvent::Of(K::kAssigned);
const AgentEvent kNoVerdict = AgentEvent::Of(K::kNoVerdict);

INSTANTIATE_TEST_SUITE_P(
    All, AgentMachineTable,
    ::testing::Values(
        Move{"JoinedRuns", In(P::kJoining), kAssigned, P::kRunning, AgentEnd::kNone},
        Move{"SignalWhileJoiningEnds", In(P::kJoining), AgentEvent::Signal(SIGINT), P::kDone, AgentEnd::kSignal},
        Move{"JoinErrorIsLaunchsOwn", In(P::kJoining), AgentEvent::Of(K::kError), P::kDone, AgentEnd::kLaunchError},
        Move{"VerdictWhileJoiningCannotCome", In(P::kJoining), AgentEvent::Answered(kSucceeded), P::kDone,
             AgentEnd::kLaunchError},
        Move{"BadEnvironmentIsBadInput", In(P::kRunning), AgentEvent::Of(K::kBadInput), P::kDone, AgentEnd::kBadInput},
        Move{"DryRunEnds", In(P::kRunning), AgentEvent::Of(K::kDryRun), P::kDone, AgentEnd::kDryRun},
        Move{"SucceededReports", In(P::kRunning), AgentEvent::GroupEnded(GroupEnd::kSucceeded), P::kReporting,
             AgentEnd::kNone},
        Move{"FailedReports", In(P::kRunning), AgentEvent::GroupEnded(GroupEnd::kFailed), P::kReporting,
             AgentEnd::kNone},
        Move{"InterruptedEndsWithItsSignal", In(P::kRunning), AgentEvent::GroupEnded(GroupEnd::kInterrupted, SIGTERM),
             P::kDone, AgentEnd::kSignal},
        Move{"StoppedByAGoneCoordinatorFails", In(P::kRunning),
             AgentEvent::GroupEnded(GroupEnd::kCoordinatorStop, 0, true), P::kDone, AgentEnd::kJobFailed},
        Move{"StoppedByTheCoordinatorReports", In(P::kRunning), AgentEvent::GroupEnded(GroupEnd::kCoordinatorStop),
             P::kReporting, AgentEnd::kNone},
        Move{"JobSucceeded", In(P::kReporting), AgentEvent::Answered(kSucceeded), P::kDone,
             AgentEnd::kSucceeded},
        Move{"OthersStillRunWait", In(P::kReporting), AgentEvent::Answered(kGoOn), P::kAwaiting,
             AgentEnd::kNone},
        Move{"OtherNodeFailedAfterOursSucceededRejoins", In(P::kReporting),
             AgentEvent::Answered(kNewRound), P::kJoining, AgentEnd::kNone},
        Move{"SucceededButJobFailed", In(P::kReporting), AgentEvent::Answered(kFailed), P::kDone,
             AgentEnd::kJobFailed},
        Move{"FailedWithBudgetBacksOff", In(P::kReporting, GroupEnd::kFailed), AgentEvent::Answered(kNewRound),
             P::kBackingOff, AgentEnd::kNone},
        Move{"FailedWithoutBudgetGivesUp", In(P::kReporting, GroupEnd::kFailed),
             AgentEvent::Answered(kFailed), P::kDone, AgentEnd::kGaveUp},
        Move{"FailedAndCoordinatorGoneGivesUp", In(P::kReporting, GroupEnd::kFailed), kNoVerdict, P::kDone,
             AgentEnd::kGaveUp},
        Move{"SucceededAndCoordinatorGoneIsLaunchsError", In(P::kReporting), kNoVerdict, P::kDone,
             AgentEnd::kLaunchError},
        Move{"AskingAndCoordinatorGoneFailsTheJob", In(P::kReporting, GroupEnd::kSucceeded, true), kNoVerdict,
             P::kDone, AgentEnd::kJobFailed},
        Move{"AskedAndNotFailedRejoins", In(P::kReporting, GroupEnd::kSucceeded, true),
             AgentEvent::Answered(kGoOn), P::kJoining, AgentEnd::kNone},
        Move{"NewRoundAfterCoordinatorStopRejoins", In(P::kReporting, GroupEnd::kCoordinatorStop),
             AgentEvent::Answered(kGoOn), P::kJoining, AgentEnd::kNone},
        Move{"CoordinatorStopAndJobFailed", In(P::kReporting, GroupEnd::kCoordinatorStop),
             AgentEvent::Answered(kFailed), P::kDone, AgentEnd::kJobFailed},
        Move{"AwaitedSuccess", In(P::kAwaiting), AgentEvent::Answered(kSucceeded), P::kDone,
             AgentEnd::kSucceeded},
        Move{"AwaitedNewRoundRejoins", In(P::kAwaiting), AgentEvent::Answered(kNewRound), P::kJoining,
             AgentEnd::kNone},
        Move{"AwaitedFailureAsksForTheVerdict", In(P::kAwaiting), AgentEvent::Answered(kFailed),
             P::kReporting, AgentEnd::kNone},
        Move{"AwaitWithoutAnswerAsks", In(P::kAwaiting), kNoVerdict, P::kReporting, AgentEnd::kNone},
        Move{"SignalWhileAwaitingEnds", In(P::kAwaiting), AgentEvent::Signal(SIGTERM), P::kDone, AgentEnd::kSignal},
        Move{"BackoffOverRejoins", In(P::kBackingOff), AgentEvent::Of(K::kBackoffOver), P::kJoining, AgentEnd::kNone},
        Move{"SignalDuringBackoffEnds", In(P::kBackingOff), AgentEvent::Signal(SIGINT), P::kDone, AgentEnd::kSignal},
        Move{"BackoffOverWhileRunningCannotCome", In(P::kRunning), AgentEvent::Of(K::kBackoffOver), P::kDone,
             AgentEnd::kLaunchError}));

// The wire's booleans as one verdict: an end outranks a new round (a failed job's heartbeat also
// says stop_workers), and success outranks failure.
TEST(AgentMachine, VerdictFromTheWiresBooleans) {
  struct Row {
    bool succeeded, failed, new_round;
    Verdict want;
  };
  for (const Row& r : {Row{false, false, false, kGoOn}, Row{false, false, true, kNewRound},
                       Row{false, true, false, kFailed}, Row{false, true, true, kFailed},
                       Row{true, false, false, kSucceeded}, Row{true, false, true, kSucceeded},
                       Row{true, true, false, kSucceeded}, Row{true, true, true, kSucceeded}}) {
    EXPECT_EQ(VerdictFrom(r.succeeded, r.failed, r.new_round), r.want)
        << r.succeeded << " " << r.failed << " " << r.new_round;
  }
}

TEST(AgentMachine, AskingIsSetOnlyByTheWaitForTheOthers) {
  AgentState s = NextAgentState(In(P::kAwaiting), kNoVerdict);
  EXPECT_TRUE(s.asking);
  s = NextAgentState(In(P::kJoining), kAssigned);
  EXPECT_FALSE(s.asking);
}

TEST(AgentMachine, NothingMovesAfterTheEnd) {
  AgentState done = NextAgentState(In(P::kJoining), AgentEvent::Signal(SIGINT));
  for (K k : {K::kAssigned, K::kDryRun, K::kGroupEnded, K::kVerdict, K::kNoVerdict, K::kBackoffOver, K::kSignal,
              K::kError, K::kBadInput}) {
    AgentState next = NextAgentState(done, AgentEvent::Of(k));
    EXPECT_EQ(next.phase, P::kDone);
    EXPECT_EQ(next.end, AgentEnd::kSignal);
    EXPECT_EQ(next.signal, SIGINT);
  }
}

TEST(FailureSummary, ListsFailedWorkersWithRootCause) {
  GroupOutcome o;
  o.kind = GroupEnd::kFailed;
  WorkerResult ok;
  ok.rank = 0;
  WorkerResult bad;
  bad.rank = 1;
  bad.local_rank = 1;
  bad.pid = 4242;
  bad.exit_code = 3;
  bad.error_message = "ValueError: x\nmore";
  bad.stderr_tail = {"line a", "line b"};
  WorkerResult killed;
  killed.rank = 2;
  killed.signal = 15;
  o.workers = {ok, bad, killed};
  o.root_cause = 1;
  std::string s = FailureSummary(o, "headline");
  EXPECT_NE(s.find("headline\n"), std::string::npos);
  EXPECT_NE(s.find("4242"), std::string::npos);
  EXPECT_NE(s.find("exit 3"), std::string::npos);
  EXPECT_NE(s.find("ValueError: x   <- root cause"), std::string::npos);
  EXPECT_EQ(s.find("more"), std::string::npos);  // first line of the message only
  EXPECT_NE(s.find("[1] stderr: line b"), std::string::npos);
  EXPECT_NE(s.find("SIGTERM"), std::string::npos);
  EXPECT_EQ(bad.AsExitCode(), 3);
  EXPECT_EQ(killed.AsExitCode(), 143);
}

}  // namespace
}  // namespace launch
