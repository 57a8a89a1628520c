#include "agent/worker_group.h"

#include "gtest/gtest.h"

namespace launch {
namespace {

using S = GroupState;
using E = GroupEvent;

struct Transition {
  S from;
  E event;
  std::optional<S> to;  // nullopt: illegal
};

void PrintTo(const Transition& c, std::ostream* os) { *os << GroupStateName(c.from) << "+" << static_cast<int>(c.event); }

class GroupStateTable : public ::testing::TestWithParam<Transition> {};

TEST_P(GroupStateTable, Transition) {
  const Transition& t = GetParam();
  auto next = NextGroupState(t.from, t.event);
  if (t.to) {
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(*next, *t.to) << GroupStateName(*next);
  } else {
    EXPECT_FALSE(next.ok()) << GroupStateName(*next);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, GroupStateTable,
    ::testing::Values(Transition{S::kInit, E::kJoin, S::kRendezvous},
                      Transition{S::kInit, E::kAssigned, std::nullopt},
                      Transition{S::kRendezvous, E::kAssigned, S::kRunning},
                      Transition{S::kRendezvous, E::kSignal, S::kInterrupted},
                      Transition{S::kRendezvous, E::kAllSucceeded, std::nullopt},
                      Transition{S::kRunning, E::kAllSucceeded, S::kSucceeded},
                      Transition{S::kRunning, E::kWorkerFailed, S::kStopping},
                      Transition{S::kRunning, E::kSignal, S::kStopping},
                      Transition{S::kRunning, E::kCoordinatorStop, S::kStopping},
                      Transition{S::kRunning, E::kRestart, std::nullopt},
                      Transition{S::kStopping, E::kSignal, S::kStopping},
                      Transition{S::kStopping, E::kWorkerFailed, S::kStopping},
                      Transition{S::kStopping, E::kAllStopped, S::kStopped},
                      Transition{S::kStopping, E::kAllSucceeded, std::nullopt},
                      Transition{S::kStopped, E::kRestart, S::kRendezvous},
                      Transition{S::kStopped, E::kGiveUp, S::kFailed},
                      Transition{S::kStopped, E::kSignal, S::kInterrupted},
                      Transition{S::kSucceeded, E::kJoin, std::nullopt},
                      Transition{S::kSucceeded, E::kRestart, S::kRendezvous},
                      Transition{S::kSucceeded, E::kGiveUp, S::kFailed},
                      Transition{S::kFailed, E::kRestart, std::nullopt},
                      Transition{S::kInterrupted, E::kJoin, std::nullopt}));

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
