#include "launcher/rendezvous.h"

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
  EXPECT_FALSE(r.Tick().has_value());  // below min: no timer
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
  auto third = r.Join(JoinOf("c", 1, 3));
  // a third node asks in while running: the next round opens; it is full at 2 only after rejoin
  EXPECT_TRUE(third.ok());
  EXPECT_EQ(r.phase(), Rendezvous::Phase::kWaiting);
}

TEST(Rendezvous, BeyondMaxIsRejected) {
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
  EXPECT_EQ(r.Status().first_failure().exit_code(), 3);
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

}  // namespace
}  // namespace launch
