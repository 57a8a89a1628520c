#include "rendezvous/local_coordinator.h"

#include <thread>

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
  LocalCoordinator c(OneRestart(), std::chrono::seconds(1), &clock);
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
  LocalCoordinator c(OneRestart(), std::chrono::seconds(1), &clock);
  auto a = c.JoinAtOnce(JoinOf("a"));
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(a->ok()) << a->status();
  EXPECT_EQ((*a)->round(), 1);

  RendezvousConfig two = OneRestart();
  two.min_nodes = two.max_nodes = 2;
  LocalCoordinator pair(two, std::chrono::seconds(1), &clock);
  EXPECT_FALSE(pair.JoinAtOnce(JoinOf("a")).has_value());  // it would wait for "b"
  auto b = pair.JoinAtOnce(JoinOf("b"));
  ASSERT_TRUE(b.has_value());
  ASSERT_TRUE(b->ok()) << b->status();
  // "a" waited in the round that "b" formed: its retry gets that round, not a new one.
  auto retried = pair.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->round(), (*b)->round());
}

TEST(LocalCoordinator, AFailureReportedEarlyStopsTheWatchAndTheRejoinGetsTheNextRound) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), std::chrono::seconds(1), &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok());
  auto stream = c.Watch();
  ASSERT_TRUE(stream->Send(Beat(*a)));
  v1::HeartbeatResponse answer;
  std::thread reader([&] { EXPECT_TRUE(stream->Receive(&answer)); });
  auto resp = c.ReportExit(Report(a->round(), false), std::chrono::seconds(1));
  ASSERT_TRUE(resp.ok());
  EXPECT_TRUE(resp->restart());
  reader.join();  // woken by the report, not by a timer
  EXPECT_TRUE(answer.stop_workers());
  EXPECT_FALSE(answer.job_failed());
  auto next = c.Join(JoinOf("a", a->round()), nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->round(), 2);
  EXPECT_EQ(next->restart_count(), 1);
  // The restart budget is spent: the next failure ends the job.
  resp = c.ReportExit(Report(next->round(), false), std::chrono::seconds(1));
  ASSERT_TRUE(resp.ok());
  EXPECT_TRUE(resp->job_failed());
  auto late = c.Join(JoinOf("a", next->round()), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
}

TEST(LocalCoordinator, ACancelledWatchReceivesNothing) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), std::chrono::seconds(1), &clock);
  auto a = c.Join(JoinOf("a"), nullptr);
  ASSERT_TRUE(a.ok());
  auto stream = c.Watch();
  ASSERT_TRUE(stream->Send(Beat(*a)));
  bool got = true;
  std::thread reader([&] {
    v1::HeartbeatResponse r;
    got = stream->Receive(&r);
  });
  stream->Cancel();
  reader.join();
  EXPECT_FALSE(got);
  EXPECT_FALSE(stream->Send(Beat(*a)));
}

TEST(LocalCoordinator, CallsForAnotherRunAreRefused) {
  FakeClock clock;
  LocalCoordinator c(OneRestart(), std::chrono::seconds(1), &clock);
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
  LocalCoordinator c(OneRestart(), std::chrono::seconds(1), &clock);
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
