#include "rendezvous/rendezvous.h"

#include <malloc.h>

#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

v1::JoinRequest JoinOf(const std::string& id, int local, int port, long last_round = 0) {
  v1::JoinRequest r;
  r.set_run_id("job");
  r.mutable_node()->set_node_id(id);
  r.mutable_node()->set_local_world_size(local);
  r.set_proposed_master_addr(id + ".host");
  r.set_proposed_master_port(port);
  r.set_last_round(last_round);
  return r;
}

v1::ReportExitRequest Report(const std::string& id, long round, bool ok) {
  v1::ReportExitRequest r;
  r.set_run_id("job");
  r.set_node_id(id);
  r.set_round(round);
  r.set_group_succeeded(ok);
  if (!ok) {
    auto* e = r.add_exits();
    e->set_rank(1);
    e->set_exit_code(3);
  }
  return r;
}

TEST(Rendezvous, SingleNodeFormsAtOnce) {
  FakeClock clock;
  Rendezvous r("job", {}, &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 2, 1234)).ok());
  auto a = r.AssignmentFor("a", 0);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->round(), 1);
  EXPECT_EQ(a->group_rank(), 0);
  EXPECT_EQ(a->world_size(), 2);
  EXPECT_EQ(a->master_addr(), "a.host");
  EXPECT_EQ(a->master_port(), 1234);
  EXPECT_FALSE(r.AssignmentFor("a", 1).has_value());  // already seen round 1
}

TEST(Rendezvous, FormsAtMinAfterLastCallWithOffsets) {
  FakeClock clock;
  RendezvousConfig cfg;
  cfg.min_nodes = 2;
  cfg.max_nodes = 3;
  cfg.last_call_timeout = std::chrono::seconds(30);
  Rendezvous r("job", cfg, &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 2, 1)).ok());
  // Below min the only timer is the join timeout.
  EXPECT_EQ(r.Tick(), clock.Now() + cfg.join_timeout);
  ASSERT_TRUE(r.Join(JoinOf("b", 3, 2)).ok());
  auto wake = r.Tick();
  ASSERT_TRUE(wake.has_value());
  EXPECT_FALSE(r.AssignmentFor("a", 0).has_value());
  clock.Advance(std::chrono::seconds(30));
  r.Tick();
  auto a = r.AssignmentFor("a", 0), b = r.AssignmentFor("b", 0);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->world_size(), 5);
  EXPECT_EQ(b->rank_offset(), 2);
  EXPECT_EQ(b->group_rank(), 1);
  EXPECT_EQ(b->master_port(), 1);  // group rank 0's proposal, for every node
}

TEST(Rendezvous, FormsAtMaxImmediately) {
  FakeClock clock;
  RendezvousConfig cfg;
  cfg.min_nodes = 1;
  cfg.max_nodes = 2;
  Rendezvous r("job", cfg, &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 2)).ok());
  EXPECT_TRUE(r.AssignmentFor("b", 0).has_value());
  // A third node asks in while a full round runs: it waits as a spare; the round goes on.
  ASSERT_TRUE(r.Join(JoinOf("c", 1, 3)).ok());
  EXPECT_TRUE(r.IsSpare("c"));
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  EXPECT_FALSE(r.AssignmentFor("c", 0).has_value());
}

TEST(Rendezvous, ARepeatedJoinFromOneNodeCountsOnce) {
  FakeClock clock;
  RendezvousConfig cfg;
  cfg.min_nodes = 3;
  cfg.max_nodes = 3;
  Rendezvous r("job", cfg, &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());  // a retry is not a second node
  EXPECT_EQ(r.waiting_nodes(), 1);
}

TEST(Rendezvous, FailureSpendsTheGlobalBudgetAndRanksStayStable) {
  FakeClock clock;
  RendezvousConfig cfg;
  cfg.min_nodes = 2;
  cfg.max_nodes = 2;
  cfg.max_restarts = 1;
  Rendezvous r("job", cfg, &clock);
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 2)).ok());
  EXPECT_EQ(r.AssignmentFor("b", 0)->group_rank(), 0);
  auto resp = r.ReportExit(Report("a", 1, false));
  EXPECT_TRUE(resp.restart());
  EXPECT_EQ(resp.restart_count(), 1);
  // b learns from its heartbeat that it must stop.
  v1::HeartbeatRequest hb;
  hb.set_node_id("b");
  hb.set_round(1);
  EXPECT_TRUE(r.Heartbeat(hb).stop_workers());
  // Rejoin in the other order: b keeps group rank 0.
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 3, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 4, 1)).ok());
  auto b = r.AssignmentFor("b", 1);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->round(), 2);
  EXPECT_EQ(b->group_rank(), 0);
  EXPECT_EQ(b->restart_count(), 1);
  EXPECT_EQ(b->master_port(), 4);
  // The budget is spent: the next failure ends the job.
  resp = r.ReportExit(Report("b", 2, false));
  EXPECT_FALSE(resp.restart());
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kFailed);
  EXPECT_EQ(r.Status().first_failure().exit().exit_code(), 3);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.Join(JoinOf("c", 1, 5))));
}

TEST(Rendezvous, SuccessNeedsEveryNode) {
  FakeClock clock;
  RendezvousConfig cfg;
  cfg.min_nodes = cfg.max_nodes = 2;
  Rendezvous r("job", cfg, &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  r.ReportExit(Report("a", 1, true));
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  r.ReportExit(Report("b", 1, true));
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kSucceeded);
}

TEST(Rendezvous, RejectsMalformedJoins) {
  FakeClock clock;
  Rendezvous r("job", {}, &clock);
  EXPECT_TRUE(absl::IsInvalidArgument(r.Join(JoinOf("", 1, 1))));
  EXPECT_TRUE(absl::IsInvalidArgument(r.Join(JoinOf("a", 0, 1))));
}

v1::HeartbeatRequest Beat(const std::string& id, long round) {
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  hb.set_node_id(id);
  hb.set_round(round);
  return hb;
}

RendezvousConfig Elastic(int lo, int hi, int restarts = 0) {
  RendezvousConfig cfg;
  cfg.min_nodes = lo;
  cfg.max_nodes = hi;
  cfg.max_restarts = restarts;
  cfg.heartbeat_timeout = std::chrono::seconds(3);
  cfg.join_timeout = std::chrono::seconds(600);
  return cfg;
}

TEST(Rendezvous, LostNodeOpensANewRoundWithoutSpendingTheBudget) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 3, 1), &clock);
  for (auto id : {"a", "b", "c"}) ASSERT_TRUE(r.Join(JoinOf(id, 2, 1)).ok());
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  clock.Advance(std::chrono::seconds(2));
  r.Heartbeat(Beat("a", 1));
  r.Heartbeat(Beat("b", 1));
  auto next = r.Tick();
  ASSERT_TRUE(next.has_value());  // c's lease runs out first
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  clock.Advance(std::chrono::milliseconds(1100));  // c silent for 3.1 s
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  EXPECT_NE(r.reason().find("lost node c"), std::string::npos) << r.reason();
  auto hb = r.Heartbeat(Beat("a", 1));
  EXPECT_TRUE(hb.stop_workers());
  EXPECT_EQ(hb.current_round(), 2);
  // Both survivors are back: the round forms at once (no last-call wait), ranks kept.
  ASSERT_TRUE(r.Join(JoinOf("b", 2, 7, 1)).ok());
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  ASSERT_TRUE(r.Join(JoinOf("a", 2, 8, 1)).ok());
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  auto a = r.AssignmentFor("a", 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->round(), 2);
  EXPECT_EQ(a->group_rank(), 0);
  EXPECT_EQ(a->group_world_size(), 2);
  EXPECT_EQ(a->world_size(), 4);
  EXPECT_EQ(a->restart_count(), 0);  // a membership change is not a restart
  EXPECT_EQ(a->master_port(), 8);
}

// SIGSTOP/SIGCONT of the coordinator (or a paused VM) expired the leases of healthy nodes: the
// time it did not run is forgiven to every lease.
TEST(Rendezvous, TimeTheCoordinatorDidNotRunDoesNotCountAgainstLeases) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2), &clock);
  for (auto id : {"a", "b"}) ASSERT_TRUE(r.Join(JoinOf(id, 1, 1)).ok());
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  clock.Advance(std::chrono::seconds(2));
  r.Heartbeat(Beat("a", 1));
  clock.Advance(std::chrono::seconds(6));  // stopped for 6 s: nobody could be heard
  r.ForgivePause(std::chrono::seconds(6));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kRunning) << r.reason();
  // Once running again, silence counts as before: b (last heard at 0) is lost 3 s after.
  clock.Advance(std::chrono::milliseconds(1100));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  EXPECT_NE(r.reason().find("lost node b"), std::string::npos) << r.reason();
}

// An ended run is kept close_timeout for the last reports; a coordinator stopped with its node
// (Ctrl-Z of the launch that hosts it) does not count the stop against it.
TEST(Rendezvous, TimeTheCoordinatorDidNotRunDoesNotCloseAnEndedRun) {
  FakeClock clock;
  RendezvousConfig cfg;
  cfg.min_nodes = cfg.max_nodes = 1;
  Rendezvous r("job", cfg, &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  r.ReportExit(Report("a", 1, false));
  ASSERT_TRUE(r.ended());
  const Clock::TimePoint ended = r.ended_at();
  clock.Advance(std::chrono::seconds(40));
  r.ForgivePause(std::chrono::seconds(40));
  EXPECT_EQ(r.ended_at(), ended + std::chrono::seconds(40));
  // A running run has no end to move.
  Rendezvous running("job2", cfg, &clock);
  ASSERT_TRUE(running.Join(JoinOf("a", 1, 1)).ok());
  const Clock::TimePoint before = running.ended_at();
  running.ForgivePause(std::chrono::seconds(5));
  EXPECT_EQ(running.ended_at(), before);
}

// Found by fuzz_rendezvous (kept in its corpus as rendezvous/regression-member-beyond-max): with
// --nnodes 1, a leaves, the spare b takes its place, and a joins again before the round formed. a
// was let in as a member of the last round and the round formed with 2 nodes. Now a waits as a
// spare and the round has b alone.
TEST(Rendezvous, ANodeBackAfterASpareTookItsPlaceWaitsAsASpare) {
  FakeClock clock;
  Rendezvous r("job", Elastic(1, 1, 2), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 2)).ok());
  EXPECT_TRUE(r.IsSpare("b"));
  v1::ReportExitRequest leave = Report("a", 1, true);
  leave.set_group_succeeded(false);
  leave.set_leaving(true);
  r.ReportExit(leave);
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1, 1)).ok());
  EXPECT_TRUE(r.IsSpare("a"));
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  auto b = r.AssignmentFor("b", 1);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->group_world_size(), 1);
  EXPECT_FALSE(r.AssignmentFor("a", 1).has_value());
}

// scancel, or a pod's deletion, stops every node at once: the other node leaves first (a new
// round opens), then the one hosting the coordinator. That ends the job, and every node counts as
// told: the host leaves at once instead of waiting close_timeout for a node that is gone.
TEST(Rendezvous, TheHostLeavingEndsTheJobAndNodesThatLeftNeedNoVerdict) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2), &clock);
  v1::JoinRequest host = JoinOf("a", 1, 1);
  host.mutable_node()->set_hosts_coordinator(true);
  host.mutable_node()->set_hostname("hosta");
  ASSERT_TRUE(r.Join(host).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 2)).ok());
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  v1::ReportExitRequest leave_b = Report("b", 1, true);
  leave_b.set_group_succeeded(false);
  leave_b.set_leaving(true);
  r.ReportExit(leave_b);
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  EXPECT_FALSE(r.EveryoneToldEnd());
  v1::ReportExitRequest leave_a = Report("a", 1, true);
  leave_a.set_group_succeeded(false);
  leave_a.set_leaving(true);
  v1::ReportExitResponse resp = r.ReportExit(leave_a);
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kFailed);
  EXPECT_TRUE(resp.job_failed());
  EXPECT_NE(r.reason().find("which hosts the coordinator, was stopped"), std::string::npos) << r.reason();
  EXPECT_TRUE(r.EveryoneToldEnd());  // no clock advanced: both left
}

// The host stopped alone (Ctrl-C on its terminal): the others learn at once that the job failed.
TEST(Rendezvous, TheHostLeavingAloneFailsTheJobForTheOthers) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2, 3), &clock);
  v1::JoinRequest host = JoinOf("a", 1, 1);
  host.mutable_node()->set_hosts_coordinator(true);
  ASSERT_TRUE(r.Join(host).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 2)).ok());
  r.Tick();
  v1::ReportExitRequest leave_a = Report("a", 1, true);
  leave_a.set_group_succeeded(false);
  leave_a.set_leaving(true);
  r.ReportExit(leave_a);
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kFailed);
  EXPECT_FALSE(r.EveryoneToldEnd());  // b still runs and has not been told
  r.NoteToldEnd("b");
  EXPECT_TRUE(r.EveryoneToldEnd());
}

// Under srun, nodes join in any order; their SLURM_NODEID orders the first round, so group rank 0
// is the first node of the allocation. Nodes without a rank, or with one out of range, follow.
TEST(Rendezvous, GivenNodeRanksOrderTheRoundSurvivorsKeepTheirPlaces) {
  FakeClock clock;
  Rendezvous r("job", Elastic(1, 4, 3), &clock);
  auto join = [](const std::string& id, std::optional<int> rank) {
    v1::JoinRequest j = JoinOf(id, 1, 1);
    if (rank) j.mutable_node()->set_node_rank(*rank);
    return j;
  };
  ASSERT_TRUE(r.Join(join("c", 2)).ok());
  ASSERT_TRUE(r.Join(join("x", std::nullopt)).ok());
  ASSERT_TRUE(r.Join(join("y", 99)).ok());
  ASSERT_TRUE(r.Join(join("a", 0)).ok());
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  EXPECT_EQ(r.AssignmentFor("a", 0)->group_rank(), 0);
  EXPECT_EQ(r.AssignmentFor("c", 0)->group_rank(), 1);
  EXPECT_EQ(r.AssignmentFor("x", 0)->group_rank(), 2);
  EXPECT_EQ(r.AssignmentFor("y", 0)->group_rank(), 3);
  // A failure: the same nodes come back in another order and keep their group ranks.
  r.ReportExit(Report("y", 1, false));
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  for (const char* id : {"y", "x", "c", "a"}) ASSERT_TRUE(r.Join(JoinOf(id, 1, 1, 1)).ok());
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  EXPECT_EQ(r.AssignmentFor("a", 1)->group_rank(), 0);
  EXPECT_EQ(r.AssignmentFor("y", 1)->group_rank(), 3);
}

TEST(Rendezvous, BelowMinAfterALossFailsAtTheJoinTimeoutNamingTheLostNode) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2), &clock);
  v1::JoinRequest b = JoinOf("b", 1, 1);
  b.mutable_node()->set_hostname("hostb");
  b.mutable_node()->set_host_address("10.0.0.2");
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(b).ok());
  clock.Advance(std::chrono::seconds(2));
  r.Heartbeat(Beat("a", 1));
  clock.Advance(std::chrono::seconds(2));
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1, 1)).ok());
  clock.Advance(std::chrono::seconds(599));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  clock.Advance(std::chrono::seconds(1));
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kFailed);
  EXPECT_NE(r.reason().find("1 of at least 2"), std::string::npos) << r.reason();
  EXPECT_NE(r.reason().find("hostb (10.0.0.2"), std::string::npos) << r.reason();
  auto v = r.ReportExit(Report("a", 1, false));
  EXPECT_TRUE(v.job_failed());
  EXPECT_FALSE(v.restart());
}

TEST(Rendezvous, NewNodeBelowMaxIsAdmittedAtTheNextRoundWithoutSpendingTheBudget) {
  FakeClock clock;
  Rendezvous r("job", Elastic(1, 2, 0), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  clock.Advance(std::chrono::seconds(30));  // last call: forms with a alone
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  ASSERT_TRUE(r.Join(JoinOf("b", 3, 1)).ok());
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  EXPECT_TRUE(r.Heartbeat(Beat("a", 1)).stop_workers());
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1, 1)).ok());  // at max: forms
  auto b = r.AssignmentFor("b", 0);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->group_rank(), 1);
  EXPECT_EQ(b->rank_offset(), 1);
  EXPECT_EQ(b->world_size(), 4);
  EXPECT_EQ(b->restart_count(), 0);
}

TEST(Rendezvous, NodesMustAskForTheSameRun) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2, 3), &clock);
  v1::JoinRequest j = JoinOf("a", 1, 1);
  *j.mutable_spec() = Elastic(2, 4, 3).ToSpec();
  auto st = r.Join(j);
  EXPECT_TRUE(absl::IsFailedPrecondition(st));
  EXPECT_NE(st.message().find("--nnodes 2:2"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--nnodes 2:4"), std::string::npos) << st.message();
}

TEST(Rendezvous, SpecRoundTripsAndRejectsBadValues) {
  RendezvousConfig cfg = Elastic(2, 5, 4);
  cfg.last_call_timeout = std::chrono::milliseconds(1500);
  auto back = RendezvousConfig::FromSpec(cfg.ToSpec());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->min_nodes, 2);
  EXPECT_EQ(back->max_nodes, 5);
  EXPECT_EQ(back->max_restarts, 4);
  EXPECT_EQ(back->last_call_timeout, std::chrono::milliseconds(1500));
  v1::RunSpec bad = cfg.ToSpec();
  bad.set_max_nodes(1);
  EXPECT_TRUE(absl::IsInvalidArgument(RendezvousConfig::FromSpec(bad).status()));
  bad = cfg.ToSpec();
  bad.set_heartbeat_timeout_s(0);
  EXPECT_TRUE(absl::IsInvalidArgument(RendezvousConfig::FromSpec(bad).status()));
}

TEST(Rendezvous, OneBudgetUnitPerRoundAndTheFirstFailureNamesItsNode) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2, 5), &clock);
  v1::JoinRequest a = JoinOf("a", 1, 1);
  a.mutable_node()->set_hostname("hosta");
  ASSERT_TRUE(r.Join(a).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  EXPECT_EQ(r.ReportExit(Report("a", 1, false)).restart_count(), 1);
  // b's workers failed too (a consequence), reported for the same round: nothing more spent.
  auto v = r.ReportExit(Report("b", 1, false));
  EXPECT_EQ(v.restart_count(), 1);
  EXPECT_TRUE(v.restart());
  EXPECT_EQ(v.first_failure().node_id(), "a");
  EXPECT_EQ(v.first_failure().hostname(), "hosta");
  EXPECT_EQ(v.first_failure().exit().exit_code(), 3);
  // A report without exits only asks for the verdict.
  v1::ReportExitRequest ask = Report("b", 1, true);
  ask.set_group_succeeded(false);
  EXPECT_EQ(r.ReportExit(ask).restart_count(), 1);
}

// A hang stops the other nodes with a request for their stacks (to see who waits for whom), and
// a hung rank outside any collective, reported later for the same round, becomes the root cause
// instead of a rank that was only waiting for it in a collective.
TEST(Rendezvous, AHangAsksTheOthersForStacksAndTheRankOutsideTheCollectiveIsTheRootCause) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2, 5), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  v1::ReportExitRequest waiting = Report("a", 1, false);
  waiting.mutable_exits(0)->set_rank(0);
  waiting.mutable_exits(0)->set_hung(true);
  waiting.mutable_exits(0)->set_in_collective(true);
  r.ReportExit(waiting);
  v1::HeartbeatResponse stop = r.Heartbeat(Beat("b", 1));
  EXPECT_TRUE(stop.stop_workers());
  EXPECT_TRUE(stop.capture_stacks());
  EXPECT_EQ(stop.reason(), "rank 0 on a hung");
  v1::ReportExitRequest culprit = Report("b", 1, false);
  culprit.mutable_exits(0)->set_hung(true);
  auto v = r.ReportExit(culprit);
  EXPECT_EQ(v.first_failure().node_id(), "b");
  EXPECT_EQ(v.first_failure().exit().rank(), 1);
  EXPECT_EQ(v.restart_count(), 1);  // still one budget unit
  // A failure that is not a hang asks for no stacks, and a new round forgets the last one.
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1, 1)).ok());
  ASSERT_TRUE(r.AssignmentFor("a", 1).has_value());
  EXPECT_FALSE(r.Heartbeat(Beat("a", 2)).capture_stacks());
  r.ReportExit(Report("a", 2, false));
  const v1::HeartbeatResponse crash = r.Heartbeat(Beat("b", 2));
  EXPECT_TRUE(crash.stop_workers());
  EXPECT_FALSE(crash.capture_stacks());
}

TEST(Rendezvous, LeavingNodeIsAMembershipChange) {
  FakeClock clock;
  Rendezvous r("job", Elastic(1, 2, 0), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  v1::ReportExitRequest leave = Report("b", 1, true);
  leave.set_group_succeeded(false);
  leave.set_leaving(true);
  auto v = r.ReportExit(leave);
  EXPECT_TRUE(v.restart());
  EXPECT_EQ(v.restart_count(), 0);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1, 1)).ok());  // the only live node is back: forms
  auto a = r.AssignmentFor("a", 1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->world_size(), 1);
}

TEST(Rendezvous, ASucceededNodeWaitsForTheOthersThenEveryoneIsTold) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  auto v = r.ReportExit(Report("a", 1, true));
  EXPECT_FALSE(v.job_succeeded());
  EXPECT_FALSE(v.restart());
  EXPECT_FALSE(Rendezvous::Urgent(r.HeartbeatAnswer(Beat("a", 1))));
  // a's lease does not matter once its workers are done.
  clock.Advance(std::chrono::seconds(10));
  r.Heartbeat(Beat("b", 1));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  v = r.ReportExit(Report("b", 1, true));
  EXPECT_TRUE(v.job_succeeded());
  EXPECT_TRUE(r.HeartbeatAnswer(Beat("a", 1)).job_succeeded());
  EXPECT_FALSE(r.EveryoneToldEnd());
  r.NoteToldEnd("b");
  r.NoteToldEnd("a");
  EXPECT_TRUE(r.EveryoneToldEnd());
}

v1::HeartbeatRequest Reattach(const std::string& id, long round, int group_rank, int nodes, int restarts) {
  v1::HeartbeatRequest hb = Beat(id, round);
  hb.mutable_node()->set_node_id(id);
  hb.mutable_node()->set_local_world_size(1);
  auto* a = hb.mutable_assignment();
  a->set_round(round);
  a->set_group_rank(group_rank);
  a->set_group_world_size(nodes);
  a->set_world_size(nodes);
  a->set_rank_offset(group_rank);
  a->set_restart_count(restarts);
  *hb.mutable_spec() = Elastic(2, 2, 3).ToSpec();
  return hb;
}

TEST(Rendezvous, RestartedCoordinatorIsRebuiltFromReRegisteringNodes) {
  FakeClock clock;
  auto cfg = Rendezvous::ConfigForReattach(Reattach("a", 4, 0, 2, 2));
  ASSERT_TRUE(cfg.ok());
  Rendezvous r("job", *cfg, &clock);
  EXPECT_TRUE(r.HeartbeatAnswer(Beat("a", 4)).unknown_node());
  auto hb = r.Heartbeat(Reattach("a", 4, 0, 2, 2));
  EXPECT_FALSE(hb.unknown_node());
  EXPECT_FALSE(hb.stop_workers());
  EXPECT_EQ(r.round(), 4);
  hb = r.Heartbeat(Reattach("b", 4, 1, 2, 2));
  EXPECT_FALSE(hb.stop_workers());
  // A stranger claiming a taken slot is told to stop.
  EXPECT_TRUE(r.Heartbeat(Reattach("c", 4, 1, 2, 2)).stop_workers());
  // The job goes on with its restart count: one more failure spends the third restart.
  EXPECT_EQ(r.ReportExit(Report("b", 4, false)).restart_count(), 3);
}

TEST(Rendezvous, SlotNeverReRegisteredIsLost) {
  FakeClock clock;
  Rendezvous r("job", *Rendezvous::ConfigForReattach(Reattach("a", 2, 0, 2, 0)), &clock);
  r.Heartbeat(Reattach("a", 2, 0, 2, 0));
  clock.Advance(std::chrono::seconds(2));
  r.Heartbeat(Beat("a", 2));
  clock.Advance(std::chrono::milliseconds(1500));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  EXPECT_NE(r.reason().find("group rank 1"), std::string::npos) << r.reason();
}

TEST(Rendezvous, CancelledJoinLeavesTheWaitingRound) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 3), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  r.CancelJoin("b");
  EXPECT_EQ(r.waiting_nodes(), 1);
  clock.Advance(std::chrono::seconds(31));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);  // no last call below min
}

TEST(Rendezvous, SpareTakesTheLostNodesPlaceWithoutSpendingTheBudget) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2, 1), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 2, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 2, 2)).ok());
  ASSERT_TRUE(r.Join(JoinOf("c", 2, 3)).ok());  // b's replacement, before b is known lost
  EXPECT_EQ(r.spare_nodes(), 1);
  clock.Advance(std::chrono::seconds(2));
  r.Heartbeat(Beat("a", 1));
  clock.Advance(std::chrono::seconds(2));
  r.Tick();  // b lost
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  // c took b's place at once; a's return completes the round.
  EXPECT_FALSE(r.IsSpare("c"));
  EXPECT_EQ(r.waiting_nodes(), 1);
  ASSERT_TRUE(r.Join(JoinOf("a", 2, 1, 1)).ok());
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  auto a = r.AssignmentFor("a", 1), c = r.AssignmentFor("c", 0);
  ASSERT_TRUE(a && c);
  EXPECT_EQ(a->group_rank(), 0);
  EXPECT_EQ(c->group_rank(), 1);
  EXPECT_EQ(c->rank_offset(), 2);
  EXPECT_EQ(c->restart_count(), 0);
}

TEST(Rendezvous, SpareWaitsBehindLiveNodesOfTheLastRound) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2, 3), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 2)).ok());
  ASSERT_TRUE(r.Join(JoinOf("c", 1, 3)).ok());
  ASSERT_TRUE(r.ReportExit(Report("a", 1, false)).restart());
  // Both nodes of round 1 are alive: the restart round is theirs, the spare keeps waiting.
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1, 1)).ok());
  EXPECT_TRUE(r.IsSpare("c"));
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 2, 1)).ok());
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  EXPECT_TRUE(r.AssignmentFor("b", 1).has_value());
  EXPECT_FALSE(r.AssignmentFor("c", 0).has_value());
  EXPECT_TRUE(r.IsSpare("c"));
  // A node that was never a member cannot take a live member's place by joining during the
  // restart round either.
  ASSERT_TRUE(r.ReportExit(Report("b", 2, false)).restart());
  ASSERT_TRUE(r.Join(JoinOf("d", 1, 4)).ok());
  EXPECT_TRUE(r.IsSpare("d"));
}

TEST(Rendezvous, SpareGivesUpAfterTheJoinTimeoutWithTheReason) {
  FakeClock clock;
  RendezvousConfig cfg = Elastic(1, 1);
  cfg.heartbeat_timeout = std::chrono::seconds(1000);
  Rendezvous r("job", cfg, &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 2)).ok());
  auto next = r.Tick();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, clock.Now() + cfg.join_timeout);
  EXPECT_FALSE(r.TakeJoinRefusal("b").has_value());
  clock.Advance(cfg.join_timeout);
  uint64_t v = r.version();
  r.Tick();
  EXPECT_NE(r.version(), v);  // held joins are re-examined
  EXPECT_FALSE(r.IsSpare("b"));
  auto refused = r.TakeJoinRefusal("b");
  ASSERT_TRUE(refused.has_value());
  EXPECT_TRUE(absl::IsResourceExhausted(*refused));
  EXPECT_NE(refused->message().find("waited as a spare"), std::string::npos) << refused->message();
  EXPECT_FALSE(r.TakeJoinRefusal("b").has_value());
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kRunning);
}

// Small blocks and the large ones malloc maps on their own.
size_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// A re-registration claiming the largest allowed round cost 2.7 MB of coordinator memory (a slot
// and an assignment per claimed rank): a rebuilt run holds the nodes that come back, nothing per
// claimed rank, and its status lists those nodes.
TEST(Rendezvous, AReRegistrationCostsWhatComesBackNotWhatItClaims) {
  FakeClock clock;
  v1::HeartbeatRequest hb = Reattach("a", 3, kMaxNodes - 1, kMaxNodes, 0);
  *hb.mutable_spec() = Elastic(1, kMaxNodes).ToSpec();
  auto cfg = Rendezvous::ConfigForReattach(hb);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const size_t before = HeapInUse();
  Rendezvous r("job", *cfg, &clock);
  EXPECT_FALSE(r.Heartbeat(hb).stop_workers());
  EXPECT_LT(static_cast<long>(HeapInUse()) - static_cast<long>(before), 64L * 1024)
      << "bytes kept for one re-registered node of " << kMaxNodes;
  v1::StatusResponse s = r.Status();
  ASSERT_EQ(s.nodes_size(), 1);
  EXPECT_EQ(s.nodes(0).group_rank(), kMaxNodes - 1);
  // The ranks that never come back are lost together, in a reason of bounded length.
  clock.Advance(std::chrono::seconds(4));
  r.Tick();
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
  EXPECT_LT(r.reason().size(), 2048u) << r.reason().substr(0, 300);
  EXPECT_NE(r.reason().find("group ranks 0, 1, 2, 3, 4, 5, 6, 7 and 16375 more (never re-registered"),
            std::string::npos)
      << r.reason();
}

// A round re-registered at INT64_MAX made the next round overflow: rounds from the wire are bounded.
TEST(Rendezvous, ReRegisteredRoundsAreBounded) {
  for (long round : {std::numeric_limits<long>::max(), static_cast<long>(kMaxRound) + 1, 0L, -1L}) {
    auto cfg = Rendezvous::ConfigForReattach(Reattach("a", round, 0, 2, 0));
    ASSERT_FALSE(cfg.ok()) << round;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(cfg.status().message().find(absl::StrCat("round ", round)), std::string::npos) << cfg.status();
  }
  FakeClock clock;
  Rendezvous r("job", *Rendezvous::ConfigForReattach(Reattach("a", kMaxRound, 0, 2, 0)), &clock);
  r.Heartbeat(Reattach("a", kMaxRound, 0, 2, 0));
  EXPECT_EQ(r.round(), kMaxRound);
  // In a running run too: a claim past the bound is not taken.
  r.Heartbeat(Reattach("b", std::numeric_limits<long>::max(), 1, 2, 0));
  EXPECT_FALSE(r.IsMember("b"));
  EXPECT_EQ(r.round(), kMaxRound);
}

// 20,000 spares took 26 s of CPU (a linear scan per join): spares are bounded and found by id.
TEST(Rendezvous, SparesAreBoundedPerRun) {
  FakeClock clock;
  Rendezvous r("job", Elastic(1, 1), &clock);
  ASSERT_TRUE(r.Join(JoinOf("a", 1, 1)).ok());
  for (int i = 0; i < kMaxSparesPerRun; ++i) ASSERT_TRUE(r.Join(JoinOf(absl::StrCat("s", i), 1, 1)).ok()) << i;
  EXPECT_EQ(r.spare_nodes(), kMaxSparesPerRun);
  ASSERT_TRUE(r.Join(JoinOf("s7", 1, 1)).ok());  // a retry keeps its place
  absl::Status st = r.Join(JoinOf("one-more", 1, 1));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find(absl::StrCat("has ", kMaxSparesPerRun, " spare node(s) waiting, the limit")),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("one-more"), std::string::npos) << st;
  // A spare that gives up makes room, at once.
  r.CancelJoin("s3");
  EXPECT_FALSE(r.IsSpare("s3"));
  EXPECT_TRUE(r.Join(JoinOf("one-more", 1, 1)).ok());
  EXPECT_TRUE(r.IsSpare("one-more"));
}

// Node ids a run remembers are bounded: ones that hold no place are forgotten first.
TEST(Rendezvous, NodeIdsPerRunAreBounded) {
  FakeClock clock;
  Rendezvous r("job", *Rendezvous::ConfigForReattach(Reattach("a", 2, 0, 2, 0)), &clock);
  r.Heartbeat(Reattach("a", 2, 0, 2, 0));
  const int limit = KnownNodesLimit(r.config().max_nodes);
  for (int i = 0; i < 3 * limit; ++i) r.Heartbeat(Reattach(absl::StrCat("x", i), 2, 0, 2, 0));  // slot taken
  EXPECT_LE(r.known_nodes(), limit);
  EXPECT_TRUE(r.IsMember("a"));
  // A stranger is remembered without the addresses it brings (16,000 with 64 each cost 145 MB).
  const size_t before = HeapInUse();
  for (int i = 0; i < 1000; ++i) {
    v1::HeartbeatRequest hb = Reattach(absl::StrCat("y", i), 2, 0, 2, 0);
    for (int k = 0; k < kMaxNodeAddresses; ++k) hb.mutable_node()->add_addresses(absl::StrCat(k, std::string(60, 'a')));
    r.Heartbeat(hb);
  }
  EXPECT_LT(static_cast<long>(HeapInUse()) - static_cast<long>(before), 1000L * 1024);
  EXPECT_FALSE(r.Heartbeat(Beat("a", 2)).stop_workers());
}

// Wire strings reach reasons (and so log lines) cut to 64 bytes.
TEST(Rendezvous, WireStringsInReasonsAreCut) {
  FakeClock clock;
  Rendezvous r("job", Elastic(2, 2), &clock);
  v1::JoinRequest a = JoinOf(std::string(250, 'a'), 1, 1);
  a.mutable_node()->set_hostname(std::string(250, 'h'));
  a.mutable_node()->set_host_address(std::string(250, 'i'));
  ASSERT_TRUE(r.Join(a).ok());
  ASSERT_TRUE(r.Join(JoinOf("b", 1, 1)).ok());
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  r.ReportExit(Report(a.node().node_id(), 1, false));
  EXPECT_LT(r.reason().size(), 400u) << r.reason();
  EXPECT_NE(r.reason().find("(250 bytes)"), std::string::npos) << r.reason();
}

// 300 nodes with 64 addresses each made a Join answer over gRPC's send limit, and the round never
// started. A join whose new addresses would take the round's address list over its budget is
// refused; the largest answer then fits in a rendezvous message.
TEST(Rendezvous, TheLargestJoinAnswerFitsInAMessage) {
  FakeClock clock;
  Rendezvous r("job", Elastic(1, 300), &clock);
  int refused = 0;
  std::string why;
  for (int i = 0; i < 300; ++i) {
    v1::JoinRequest j = JoinOf(absl::StrCat("n", i), 1, 1);
    j.set_agent_store(true);
    auto addr = [&](int k) {
      std::string a = absl::StrCat(i, ".", k, ".");
      return a + std::string(kMaxAddressLength - a.size(), 'f');
    };
    j.mutable_node()->set_host_address(addr(kMaxNodeAddresses));
    for (int k = 0; k < kMaxNodeAddresses; ++k) j.mutable_node()->add_addresses(addr(k));
    absl::Status st = r.Join(j);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
      why = std::string(st.message());
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_NE(why.find(absl::StrCat("over its limit of ", kMaxMemberAddressBytes)), std::string::npos) << why;
  clock.Advance(r.config().last_call_timeout + std::chrono::seconds(1));
  r.Tick();
  ASSERT_EQ(r.phase(), Rendezvous::Phase::kRunning);
  v1::JoinResponse answer;
  *answer.mutable_assignment() = *r.AssignmentFor("n0", 0);
  answer.mutable_assignment()->set_lease_key(std::string(64, 'k'));
  EXPECT_GT(answer.assignment().member_addresses_size(), 10000);
  EXPECT_LT(answer.ByteSizeLong(), static_cast<size_t>(kMaxRendezvousMessageBytes));
}
}  // namespace
}  // namespace launch
