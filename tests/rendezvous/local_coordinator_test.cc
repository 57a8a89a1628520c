#include "rendezvous/local_coordinator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

v1::JoinRequest JoinOf(const std::string& id, long last_round = 0) {
  v1::JoinRequest r;
  r.set_run_id("job");
  r.mutable_node()->set_node_id(id);
  r.mutable_node()->set_hostname("host");
  r.mutable_node()->set_local_world_size(2);
  r.set_proposed_master_addr("127.0.0.1");
  r.set_proposed_master_port(1234);
  r.set_last_round(last_round);
  return r;
}

v1::ReportExitRequest Report(long round, bool ok) {
  v1::ReportExitRequest r;
  r.set_run_id("job");
  r.set_node_id("a");
  r.set_round(round);
  r.set_group_succeeded(ok);
  if (!ok) {
    auto* e = r.add_exits();
    e->set_rank(1);
    e->set_exit_code(3);
  }
  return r;
}

RendezvousConfig OneRestart() {
  RendezvousConfig c;
  c.max_restarts = 1;
  return c;
}

v1::HeartbeatRequest Beat(const v1::Assignment& a) {
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  hb.set_node_id("a");
  hb.set_round(a.round());
  return hb;
}

TEST(LocalCoordinator, ASingleNodeRoundFormsAtItsJoin) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->round(), 1);
  EXPECT_EQ(a->group_rank(), 0);
  EXPECT_EQ(a->world_size(), 2);
  EXPECT_EQ(a->master_port(), 1234);
  EXPECT_EQ(a->lease_port(), 0);  // no datagrams: nothing listens for them
}

TEST(LocalCoordinator, AJoinIsAnsweredAtOnceOnlyWhenItsRoundForms) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), &clock);
  auto a = c.JoinAtOnce(JoinOf("a"));
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(a->ok()) << a->status();
  EXPECT_EQ((*a)->round(), 1);

  RendezvousConfig two = OneRestart();
  two.min_nodes = two.max_nodes = 2;
  LocalCoordinator pair(two, &clock);
  EXPECT_FALSE(pair.JoinAtOnce(JoinOf("a")).has_value());  // it would wait for "b"
  auto b = pair.JoinAtOnce(JoinOf("b"));
  ASSERT_TRUE(b.has_value());
  ASSERT_TRUE(b->ok()) << b->status();
  // "a" waited in the round that "b" formed: its retry gets that round, not a new one.
  auto retried = pair.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->round(), (*b)->round());
}

v1::HeartbeatRequest Registration(const v1::Assignment& a) {
  v1::HeartbeatRequest hb = Beat(a);
  hb.mutable_node()->set_node_id("a");
  *hb.mutable_assignment() = a;
  return hb;
}

// The watch in process: no stream, no thread. The answer comes from the call that changes the run.
TEST(LocalCoordinator, AWatchInProcessIsAnsweredByTheReportThatStopsTheRound) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok());
  std::vector<v1::HeartbeatResponse> answers;
  auto watch = c.WatchInProcess(Registration(*a), [&](const v1::HeartbeatResponse& r) { answers.push_back(r); });
  ASSERT_NE(watch, nullptr);
  EXPECT_TRUE(answers.empty());
  auto resp = c.ReportExit(Report(a->round(), false), std::chrono::seconds(1));
  ASSERT_TRUE(resp.ok());
  EXPECT_TRUE(resp->restart());
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].stop_workers());
  EXPECT_FALSE(answers[0].job_failed());
  // Answered once: later calls that change the run do not call it again.
  auto next = c.Join(JoinOf("a", a->round()), nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(answers.size(), 1u);
  watch.reset();
  // The next round's watch is told the job's end, once.
  watch = c.WatchInProcess(Registration(*next), [&](const v1::HeartbeatResponse& r) { answers.push_back(r); });
  ASSERT_TRUE(c.ReportExit(Report(next->round(), false), std::chrono::seconds(1))->job_failed());
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_TRUE(answers[1].job_failed());
  auto late = c.Join(JoinOf("a", next->round()), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
}

// A node watched in process keeps its lease without heartbeats, however long the run is quiet:
// the next call renews it before the state machine looks at leases.
TEST(LocalCoordinator, AWatchInProcessHoldsItsLeaseWithoutHeartbeats) {
  FakeClock clock;
  RendezvousConfig cfg = OneRestart();
  cfg.heartbeat_timeout = std::chrono::seconds(5);
  LocalCoordinator c(cfg, &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok());
  int answered = 0;
  auto watch = c.WatchInProcess(Registration(*a), [&](const v1::HeartbeatResponse&) { ++answered; });
  clock.Advance(std::chrono::minutes(10));
  v1::SampleRequest sample;
  sample.set_run_id("job");
  sample.set_node_id("a");
  sample.set_round(a->round());
  (void)c.Sample(sample, std::chrono::seconds(1));
  auto hb = c.Heartbeat(Beat(*a));
  ASSERT_TRUE(hb.ok());
  EXPECT_FALSE(hb->stop_workers()) << hb->reason();
  EXPECT_EQ(answered, 0);
  // Without the watch, the same quiet costs the node its lease: the round stops.
  watch.reset();
  clock.Advance(std::chrono::minutes(10));
  (void)c.Sample(sample, std::chrono::seconds(1));
  hb = c.Heartbeat(Beat(*a));
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->stop_workers() || hb->unknown_node() || hb->job_failed()) << hb->DebugString();
}

TEST(LocalCoordinator, ADestroyedWatchInProcessIsNotCalledAndAStreamEndsAtOnce) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok());
  int answered = 0;
  auto watch = c.WatchInProcess(Registration(*a), [&](const v1::HeartbeatResponse&) { ++answered; });
  watch.reset();
  ASSERT_TRUE(c.ReportExit(Report(a->round(), false), std::chrono::seconds(1))->restart());
  EXPECT_EQ(answered, 0);
  auto stream = c.Watch();
  v1::HeartbeatResponse r;
  EXPECT_FALSE(stream->Send(Beat(*a)));
  EXPECT_FALSE(stream->Receive(&r));
  EXPECT_TRUE(absl::IsFailedPrecondition(stream->Finish()));
}

TEST(LocalCoordinator, AWatchInProcessForAnotherRunIsRefusedAtOnce) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok());
  v1::HeartbeatRequest other = Registration(*a);
  other.set_run_id("other");
  std::vector<v1::HeartbeatResponse> answers;
  auto watch = c.WatchInProcess(other, [&](const v1::HeartbeatResponse& r) { answers.push_back(r); });
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].stop_workers());
  EXPECT_THAT(answers[0].reason(), ::testing::HasSubstr("other"));
}

TEST(LocalCoordinator, CallsForAnotherRunAreRefused) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), &clock);
  ASSERT_TRUE(c.Join(JoinOf("a"), nullptr).ok());
  v1::ReportExitRequest other = Report(1, true);
  other.set_run_id("other");
  EXPECT_TRUE(absl::IsNotFound(c.ReportExit(other, std::chrono::seconds(1)).status()));
  v1::JoinRequest join = JoinOf("b");
  join.set_run_id("other");
  EXPECT_FALSE(c.Join(join, nullptr).ok());
}

TEST(LocalCoordinator, SamplesOfTheRoundAreTakenAndOthersRefused) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok());
  v1::SampleRequest s;
  s.set_run_id("job");
  s.set_node_id("a");
  s.set_round(a->round());
  EXPECT_TRUE(c.Sample(s, std::chrono::seconds(1)).ok());
  s.set_round(a->round() + 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(c.Sample(s, std::chrono::seconds(1)).status()));
  s.set_round(a->round());
  s.set_node_id("b");
  EXPECT_TRUE(absl::IsFailedPrecondition(c.Sample(s, std::chrono::seconds(1)).status()));
}

}  // namespace
}  // namespace launch
