// The replicated coordinators' pure parts: a run's record and the run rebuilt from it (checked
// like wire input), the agent's client that follows the leader among replicas, and etcd URLs.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rendezvous/failover_coordinator_client.h"
#include "rendezvous/lease.h"
#include "rendezvous/rendezvous.h"
#include "tests/fakes/fake_coordinator_client.h"
#ifdef LAUNCH_WITH_ETCD
#include "rendezvous/etcd_client.h"
#endif

namespace launch {
namespace {

using ::testing::HasSubstr;

v1::JoinRequest JoinOf(const std::string& id, int local) {
  v1::JoinRequest r;
  r.set_run_id("job");
  r.mutable_node()->set_node_id(id);
  r.mutable_node()->set_hostname(id + "-host");
  r.mutable_node()->set_local_world_size(local);
  r.mutable_node()->add_addresses("10.0.0.1");
  r.set_proposed_master_addr(id + ".host");
  r.set_proposed_master_port(29500);
  return r;
}

RendezvousConfig TwoNodes() {
  RendezvousConfig c;
  c.min_nodes = 2;
  c.max_nodes = 2;
  c.max_restarts = 3;
  return c;
}

// A record of a run whose round 1 formed with nodes a (2 workers) and b (3), the run's key set.
v1::RunRecord FormedRecord(Rendezvous* r) {
  EXPECT_TRUE(r->Join(JoinOf("a", 2)).ok());
  EXPECT_TRUE(r->Join(JoinOf("b", 3)).ok());
  v1::RunRecord rec = r->ToRecord();
  rec.set_lease_key(NewLeaseKey());
  return rec;
}

TEST(RunRecord, ANewLeaderCarriesTheRunOnWithItsRanksBudgetAndLeases) {
  FakeClock clock;
  Rendezvous r("job", TwoNodes(), &clock);
  v1::RunRecord rec = FormedRecord(&r);
  ASSERT_EQ(rec.members_size(), 2);
  EXPECT_EQ(rec.round(), 1);

  clock.Advance(std::chrono::seconds(100));  // long past every lease: the new leader forgives it
  auto carried = Rendezvous::FromRecord(rec, &clock);
  ASSERT_TRUE(carried.ok()) << carried.status();
  Rendezvous& n = **carried;
  EXPECT_EQ(n.phase(), Rendezvous::Phase::kRunning);
  EXPECT_EQ(n.round(), 1);
  EXPECT_EQ(n.version(), r.version());
  for (const char* id : {"a", "b"}) {
    auto old_a = r.AssignmentFor(id, 0);
    auto new_a = n.AssignmentFor(id, 0);
    ASSERT_TRUE(old_a && new_a);
    EXPECT_EQ(new_a->SerializeAsString(), old_a->SerializeAsString()) << id;
  }
  // Every member has a whole heartbeat timeout from the takeover to renew its lease.
  EXPECT_EQ(n.Tick().value(), clock.Now() + TwoNodes().heartbeat_timeout + std::chrono::milliseconds(1));
  // A failure then spends the job's budget as before.
  v1::ReportExitRequest failed;
  failed.set_run_id("job");
  failed.set_node_id("b");
  failed.set_round(1);
  failed.add_exits()->set_exit_code(3);
  auto resp = n.ReportExit(failed);
  EXPECT_TRUE(resp.restart());
  EXPECT_EQ(resp.restart_count(), 1);
  v1::RunRecord waiting = n.ToRecord();
  EXPECT_EQ(waiting.phase(), static_cast<int>(Rendezvous::Phase::kWaiting));
  EXPECT_EQ(waiting.restart_count(), 1);
  EXPECT_GT(waiting.version(), rec.version());
}

TEST(RunRecord, ANodesSuccessIsKeptSoThatANewLeaderDoesNotWaitForIt) {
  FakeClock clock;
  Rendezvous r("job", TwoNodes(), &clock);
  v1::RunRecord before = FormedRecord(&r);
  v1::ReportExitRequest ok;
  ok.set_run_id("job");
  ok.set_node_id("a");
  ok.set_round(1);
  ok.set_group_succeeded(true);
  r.ReportExit(ok);
  v1::RunRecord after = r.ToRecord();
  EXPECT_GT(after.version(), before.version());
  EXPECT_TRUE(after.members(0).succeeded());
}

TEST(RunRecord, WhatEtcdHoldsIsCheckedLikeWireInput) {
  struct Case {
    const char* name;
    std::function<void(v1::RunRecord*)> spoil;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"run id", [](v1::RunRecord* r) { r->set_run_id("a b"); }, "run id"},
      {"spec", [](v1::RunRecord* r) { r->mutable_spec()->set_max_nodes(0); }, "nnodes"},
      {"phase", [](v1::RunRecord* r) { r->set_phase(7); }, "phase 7"},
      {"round", [](v1::RunRecord* r) { r->set_round(kMaxRound + 1); }, "round"},
      {"restarts", [](v1::RunRecord* r) { r->set_restart_count(4); }, "restart count 4 (expected 0-3)"},
      {"lease key", [](v1::RunRecord* r) { r->set_lease_key("short"); }, "a lease key of 5 bytes"},
      {"too many members", [](v1::RunRecord* r) { *r->add_members() = r->members(0); }, "3 members"},
      {"a node twice", [](v1::RunRecord* r) { *r->mutable_members(1)->mutable_node() = r->members(0).node(); },
       "member 1"},
      {"rank", [](v1::RunRecord* r) { r->mutable_members(1)->mutable_assignment()->set_group_rank(0); },
       "group rank 0"},
      {"workers", [](v1::RunRecord* r) { r->mutable_members(0)->mutable_node()->set_local_world_size(0); },
       "local_world_size 0"},
      {"addresses",
       [](v1::RunRecord* r) {
         for (int i = 0; i < 65; ++i) r->mutable_members(0)->mutable_node()->add_addresses("10.0.0.9");
       },
       "addresses"},
      {"assignment", [](v1::RunRecord* r) { r->mutable_members(0)->mutable_assignment()->set_master_port(70000); },
       "master_port"},
  };
  for (const Case& c : cases) {
    FakeClock clock;
    Rendezvous r("job", TwoNodes(), &clock);
    v1::RunRecord rec = FormedRecord(&r);
    ASSERT_TRUE(Rendezvous::FromRecord(rec, &clock).ok()) << c.name;
    c.spoil(&rec);
    auto carried = Rendezvous::FromRecord(rec, &clock);
    ASSERT_FALSE(carried.ok()) << c.name;
    EXPECT_TRUE(absl::IsDataLoss(carried.status())) << c.name << ": " << carried.status();
    EXPECT_THAT(std::string(carried.status().message()), HasSubstr(c.says)) << c.name;
  }
}

// Replicas as fake clients: `down` ones are unreachable.
struct Replicas {
  std::vector<testing::FakeCoordinatorClient*> fakes;
  std::unique_ptr<FailoverCoordinatorClient> client;
  explicit Replicas(int n) {
    std::vector<std::unique_ptr<CoordinatorClient>> clients;
    for (int i = 0; i < n; ++i) {
      auto f = std::make_unique<testing::FakeCoordinatorClient>();
      f->target_name = "replica" + std::to_string(i);
      fakes.push_back(f.get());
      clients.push_back(std::move(f));
    }
    client = std::make_unique<FailoverCoordinatorClient>(std::move(clients));
  }
};

TEST(FailoverClient, ACallGoesOnToTheNextReplicaAndStaysWithTheOneThatAnswered) {
  Replicas r(3);
  r.fakes[2]->answer_unscripted = true;  // the leader; the others are unreachable (or stand by)
  v1::JoinRequest join = JoinOf("a", 1);
  auto a = r.client->Join(join, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(r.fakes[0]->join_calls(), 1);
  EXPECT_EQ(r.fakes[1]->join_calls(), 1);
  EXPECT_EQ(r.client->target(), "replica2");
  ASSERT_TRUE(r.client->ReportExit(v1::ReportExitRequest(), std::chrono::seconds(1)).ok());
  EXPECT_EQ(r.fakes[0]->report_calls(), 0);  // straight to the one that answered
  EXPECT_EQ(r.fakes[2]->report_calls(), 1);
  EXPECT_EQ(r.client->targets(), "replica0,replica1,replica2");
}

TEST(FailoverClient, ARefusalIsTheAnswerAndNoReplicaAnsweringIsUnreachable) {
  Replicas r(2);
  r.fakes[0]->joins.push_back(absl::FailedPreconditionError("run 'job' has ended"));
  auto refused = r.client->Join(JoinOf("a", 1), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status()));
  EXPECT_EQ(r.fakes[1]->join_calls(), 0);
  auto none = r.client->Join(JoinOf("a", 1), nullptr);
  EXPECT_TRUE(CoordinatorUnreachable(none.status())) << none.status();
  EXPECT_EQ(r.fakes[0]->join_calls(), 2);
  EXPECT_EQ(r.fakes[1]->join_calls(), 1);
}

TEST(FailoverClient, AWatchStreamThatEndsUnreachableSendsTheNextOneToTheNextReplica) {
  Replicas r(2);
  r.fakes[0]->unreachable_watches = 1;
  auto first = r.client->Watch();
  v1::HeartbeatResponse resp;
  EXPECT_FALSE(first->Receive(&resp));
  EXPECT_TRUE(CoordinatorUnreachable(first->Finish()));
  EXPECT_EQ(r.client->target(), "replica1");
  auto second = r.client->Watch();
  EXPECT_EQ(r.fakes[1]->watch_calls(), 1);
}

#ifdef LAUNCH_WITH_ETCD
TEST(EtcdUrl, EndpointsPrefixAndMistakes) {
  auto o = ParseEtcdUrl("etcd://h1:2379,h2,[::1]:2380/jobs/a/");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoints, (std::vector<std::string>{"h1:2379", "h2:2379", "[::1]:2380"}));
  EXPECT_EQ(o->prefix, "/jobs/a");
  EXPECT_EQ(ParseEtcdUrl("etcd://h1").value().prefix, "/launch");
  for (const char* bad : {"http://h1:2379", "etcd://", "etcd://h1:99999", "etcd://:2379"}) {
    auto b = ParseEtcdUrl(bad);
    EXPECT_FALSE(b.ok()) << bad;
    EXPECT_THAT(std::string(b.status().message()), HasSubstr(bad)) << bad;
  }
  EXPECT_EQ(EtcdClient::PrefixEnd("/launch/runs/"), "/launch/runs0");
  EXPECT_EQ(EtcdClient::PrefixEnd(std::string("a\xff", 2)), "b");
}
#endif

}  // namespace
}  // namespace launch
