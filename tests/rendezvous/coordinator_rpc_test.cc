// The coordinator's gRPC service in-process on 127.0.0.1:0, driven by raw stubs: what it rejects
// and with which status (tokens, malformed and oversized messages, unknown and ended runs).
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rendezvous/lease.h"
#include "common/limits.h"
#include "rendezvous/coordinator.h"
#include "rendezvous/grpc_coordinator_client.h"
#include "rendezvous/local_token.h"
#include "rendezvous/grpc_log.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace {

using ::testing::HasSubstr;

class CoordinatorRpc : public ::testing::Test {
 protected:
  void Start(const std::string& token = "", const Clock* clock = nullptr) {
    SecurityOptions security;
    security.token = token;
    auto server = CoordinatorServer::Start("127.0.0.1:0", CoordinatorOptions{}, security, clock ? clock : &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);  // so that an oversized request reaches the server
    stub_ = v1::Rendezvous::NewStub(
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
  }
  // With the token, and the node key of the last node a test called `As` (none before).
  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "") {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    // Without one, the token an owner-only coordinator (loopback, no token) published, as its
    // user's clients send it.
    const std::string t = token.empty() && server_ ? ReadLocalToken(server_->port()) : token;
    if (!t.empty()) ctx->AddMetadata(kTokenMetadataKey, t);
    if (!node_key_.empty()) ctx->AddMetadata(kNodeKeyMetadataKey, node_key_);
    return ctx;
  }
  // Later calls speak as the node this join answered.
  void As(const v1::JoinResponse& joined) { node_key_ = joined.assignment().lease_key(); }
  static v1::JoinRequest Join(const std::string& run, const std::string& node) {
    v1::JoinRequest j;
    j.set_run_id(run);
    j.mutable_node()->set_node_id(node);
    j.mutable_node()->set_local_world_size(1);
    j.set_proposed_master_addr("127.0.0.1");
    j.set_proposed_master_port(29500);
    j.mutable_spec()->set_min_nodes(1);
    j.mutable_spec()->set_max_nodes(1);
    j.mutable_spec()->set_join_timeout_s(60);
    j.mutable_spec()->set_heartbeat_timeout_s(3);
    j.mutable_spec()->set_close_timeout_s(30);
    j.mutable_spec()->set_last_call_timeout_s(1);
    return j;
  }

  SystemClock clock_;
  FakeClock fake_;  // for timing tests: moved only by the test
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::string node_key_;
};

TEST_F(CoordinatorRpc, MalformedJoinsAreInvalidArgument) {
  Start();
  v1::JoinRequest zero = Join("job", "a");
  zero.mutable_node()->set_local_world_size(0);
  v1::JoinRequest bad_spec = Join("job", "a");
  bad_spec.mutable_spec()->set_max_nodes(0);
  // Nothing that comes over the wire was unbounded or unchecked: node counts, ids, the master
  // address and port a node proposes (they reach every worker of the job).
  v1::JoinRequest huge_spec = Join("job", "a");
  huge_spec.mutable_spec()->set_max_nodes(5000000);
  v1::JoinRequest no_master = Join("job", "a");
  no_master.set_proposed_master_addr("");
  v1::JoinRequest odd_master = Join("job", "a");
  odd_master.set_proposed_master_addr("host name");
  v1::JoinRequest port_zero = Join("job", "a");
  port_zero.set_proposed_master_port(0);
  v1::JoinRequest port_big = Join("job", "a");
  port_big.set_proposed_master_port(70000);
  const std::vector<std::pair<v1::JoinRequest, std::string>> cases = {
      {Join("job", ""), "node id"},
      {zero, "local_world_size 0"},
      {Join("job\n1", "a"), "run id"},
      {bad_spec, "expected 1 <= MIN <= MAX"},
      {huge_spec, "at most 16384 nodes"},
      {Join("job", std::string(kMaxNodeIdLength + 1, 'n')), "node id missing, over 255 bytes"},
      {no_master, "proposed master address missing"},
      {odd_master, "proposed master address"},
      {port_zero, "proposed master port 0: expected 1-65535"},
      {port_big, "proposed master port 70000"},
  };
  for (const auto& [req, why] : cases) {
    v1::JoinResponse resp;
    grpc::Status st = stub_->Join(Ctx().get(), req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << why;
    EXPECT_THAT(st.error_message(), HasSubstr(why));
  }
}

// One 88-byte Heartbeat re-registering with group_world_size 5,000,000 took a coordinator from
// 12 MiB to 2.9 GiB (20,000,000 aborted it). A re-registration is bounded by the run's spec now,
// and a heartbeat's node id is checked like a join's.
TEST_F(CoordinatorRpc, ReRegistrationIsBoundedByTheRunsSpec) {
  Start();
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  hb.set_node_id("a");
  hb.set_round(1);
  *hb.mutable_node() = Join("job", "a").node();
  *hb.mutable_spec() = Join("job", "a").spec();
  hb.mutable_assignment()->set_round(1);
  hb.mutable_assignment()->set_group_rank(0);
  hb.mutable_assignment()->set_group_world_size(5000000);
  hb.mutable_assignment()->set_world_size(5000000);
  v1::HeartbeatResponse resp;
  grpc::Status st = stub_->Heartbeat(Ctx().get(), hb, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("node 0 of 5000000"));
  EXPECT_THAT(st.error_message(), HasSubstr("expected a round >= 1 of 1-1 nodes"));
  EXPECT_EQ(server_->service()->runs_for_test(), 0);
  hb.mutable_assignment()->set_group_world_size(1);
  hb.mutable_assignment()->set_world_size(1);
  hb.set_node_id(std::string(kMaxNodeIdLength + 1, 'n'));
  st = stub_->Heartbeat(Ctx().get(), hb, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("node id missing, over 255 bytes"));
  // Within the spec, a restarted coordinator takes the node back, with the key it brings.
  hb.set_node_id("a");
  hb.mutable_assignment()->set_lease_key(std::string(kLeaseKeyBytes, 'k'));
  st = stub_->Heartbeat(Ctx().get(), hb, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("no node key (x-launch-node-key-bin) for node a"));
  node_key_ = hb.assignment().lease_key();
  st = stub_->Heartbeat(Ctx().get(), hb, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_FALSE(resp.unknown_node());
  EXPECT_EQ(server_->service()->runs_for_test(), 1);
}

TEST_F(CoordinatorRpc, OversizedMessagesAreRefusedAndLoggedWithThePeer) {
  Start();
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  v1::JoinResponse resp;
  grpc::Status st = stub_->Join(Ctx().get(), Join("job", std::string(kMaxRendezvousMessageBytes + 1, 'x')), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("over the rendezvous limit of 1048576 bytes"));
  // Far larger: gRPC refuses it before it is parsed.
  st = stub_->Join(Ctx().get(), Join("job", std::string(kGrpcReceiveLimitBytes + 1, 'x')), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  spdlog::default_logger()->flush();
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_THAT(log.str(), HasSubstr("rejected Join from ipv4:127.0.0.1:"));
}

TEST_F(CoordinatorRpc, UnknownAndEndedRunsAreRefused) {
  Start();
  v1::ReportExitRequest report;
  report.set_run_id("nosuch");
  report.set_node_id("a");
  v1::ReportExitResponse rresp;
  grpc::Status st = stub_->ReportExit(Ctx().get(), report, &rresp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(), HasSubstr("no run 'nosuch'"));
  v1::StatusRequest sreq;
  sreq.set_run_id("nosuch");
  v1::StatusResponse sresp;
  EXPECT_EQ(stub_->Status(Ctx().get(), sreq, &sresp).error_code(), grpc::StatusCode::NOT_FOUND);

  // A one-node run: joined, then succeeded; a later join to the same id is told it has ended.
  v1::JoinResponse resp;
  ASSERT_TRUE(stub_->Join(Ctx().get(), Join("job", "a"), &resp).ok());
  As(resp);
  report.set_run_id("job");
  report.set_round(resp.assignment().round());
  report.set_group_succeeded(true);
  ASSERT_TRUE(stub_->ReportExit(Ctx().get(), report, &rresp).ok());
  EXPECT_TRUE(rresp.job_succeeded());
  st = stub_->Join(Ctx().get(), Join("job", "b"), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("run 'job' has ended (succeeded)"));
}

TEST_F(CoordinatorRpc, EveryRpcNeedsTheToken) {
  Start("the-token");
  v1::JoinResponse resp;
  EXPECT_EQ(stub_->Join(Ctx().get(), Join("job", "a"), &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub_->Join(Ctx("wrong").get(), Join("job", "a"), &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::StatusRequest sreq;
  sreq.set_run_id("job");
  v1::StatusResponse sresp;
  EXPECT_EQ(stub_->Status(Ctx().get(), sreq, &sresp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::ReportExitResponse rresp;
  EXPECT_EQ(stub_->ReportExit(Ctx().get(), v1::ReportExitRequest(), &rresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::HeartbeatResponse hresp;
  EXPECT_EQ(stub_->Heartbeat(Ctx().get(), v1::HeartbeatRequest(), &hresp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // The Watch stream too, before it reads anything.
  auto ctx = Ctx();
  auto watch = stub_->Watch(ctx.get());
  v1::HeartbeatResponse ignored;
  EXPECT_FALSE(watch->Read(&ignored));
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // With it, the run forms.
  EXPECT_TRUE(stub_->Join(Ctx("the-token").get(), Join("job", "a"), &resp).ok());
  EXPECT_EQ(resp.assignment().world_size(), 1);
}

// A coordinator restarted on its port serves a moment before it publishes its new token, and its
// user's agents call in with the old one from the file: that refusal is "unavailable" to the
// client (its callers retry, reading the file again), not the end of the job; a token the user
// gave stays a refusal.
TEST_F(CoordinatorRpc, AStaleLocalTokenIsUnavailableUntilTheNewOneIsPublished) {
  Start("the-new-token");
  const int port = server_->port();
  auto stale = LocalTokenFile::Publish(port, "the-token-of-the-coordinator-before");
  ASSERT_TRUE(stale.ok()) << stale.status();
  const auto client_with = [&](const std::string& token) {
    auto c = std::make_unique<GrpcCoordinatorClient>(grpc::CreateChannel(server_->address(),
                                                                         grpc::InsecureChannelCredentials()),
                                                     server_->address(), token, std::chrono::seconds(10));
    c->UseLocalToken(port);
    return c;
  };
  auto mine = client_with("");
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  absl::StatusOr<v1::HeartbeatResponse> got = mine->Heartbeat(hb);
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("refused the token of its port's file"));
  std::unique_ptr<WatchStream> watch = mine->Watch();
  v1::HeartbeatResponse ignored;
  EXPECT_FALSE(watch->Receive(&ignored));
  const absl::Status finished = watch->Finish();
  EXPECT_TRUE(absl::IsUnavailable(finished)) << finished;
  // A token of the user's own is theirs to get right.
  EXPECT_TRUE(absl::IsUnauthenticated(client_with("a-token-the-user-gave")->Heartbeat(hb).status()));
  // Once the new coordinator's token is in the file, the same client is let in.
  stale->reset();
  auto fresh = LocalTokenFile::Publish(port, "the-new-token");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  got = mine->Heartbeat(hb);
  EXPECT_FALSE(absl::IsUnavailable(got.status()) || absl::IsUnauthenticated(got.status())) << got.status();
}

TEST_F(CoordinatorRpc, WatchStreamAnswersOnceWhenTheNodeMustStop) {
  Start();
  v1::JoinResponse resp;
  v1::JoinRequest j = Join("job", "a");
  j.mutable_spec()->set_max_restarts(1);
  ASSERT_TRUE(stub_->Join(Ctx().get(), j, &resp).ok());
  As(resp);
  auto ctx = Ctx();
  auto watch = stub_->Watch(ctx.get());
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  hb.set_node_id("a");
  hb.set_round(resp.assignment().round());
  ASSERT_TRUE(watch->Write(hb));
  ASSERT_TRUE(watch->Write(hb));  // a lease renewal: no answer
  // A failure report opens round 2: the stream tells the node to stop, then ends.
  v1::ReportExitRequest report;
  report.set_run_id("job");
  report.set_node_id("a");
  report.set_round(resp.assignment().round());
  report.add_exits()->set_exit_code(3);
  v1::ReportExitResponse rresp;
  ASSERT_TRUE(stub_->ReportExit(Ctx().get(), report, &rresp).ok());
  EXPECT_TRUE(rresp.restart());
  v1::HeartbeatResponse answer;
  ASSERT_TRUE(watch->Read(&answer));
  EXPECT_TRUE(answer.stop_workers());
  EXPECT_EQ(answer.current_round(), 2);
  EXPECT_FALSE(watch->Read(&answer));
  EXPECT_TRUE(watch->Finish().ok());
}

// Seconds since the lease of `node` in run "job" was last renewed (-1: not known).
// (`port`: an owner-only coordinator's, whose token its user reads.)
double SecondsSinceLease(v1::Rendezvous::Stub* stub, const std::string& node, int port) {
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, ReadLocalToken(port));
  v1::StatusRequest req;
  req.set_run_id("job");
  v1::StatusResponse resp;
  if (!stub->Status(&ctx, req, &resp).ok()) return -1;
  for (const auto& n : resp.nodes())
    if (n.node().node_id() == node) return n.seconds_since_heartbeat();
  return -1;
}

bool Eventually(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

TEST_F(CoordinatorRpc, LeaseDatagramsRenewTheLeaseAndForgeriesAndReplaysDoNot) {
  Start("", &fake_);  // lease ages move only when the test says
  // A two-node run: node b's datagrams mark how far the coordinator has read.
  v1::JoinResponse ra, rb;
  auto join2 = [&](const std::string& node, v1::JoinResponse* r) {
    v1::JoinRequest j = Join("job", node);
    j.mutable_spec()->set_min_nodes(2);
    j.mutable_spec()->set_max_nodes(2);
    return stub_->Join(Ctx().get(), j, r).ok();
  };
  bool b_ok = false;
  std::thread tb([&] { b_ok = join2("b", &rb); });
  ASSERT_TRUE(join2("a", &ra));
  tb.join();
  ASSERT_TRUE(b_ok);
  const v1::Assignment& a = ra.assignment();
  ASSERT_EQ(a.lease_port(), server_->port());
  ASSERT_EQ(a.lease_key().size(), kLeaseKeyBytes);
  ASSERT_NE(rb.assignment().lease_key(), a.lease_key());  // one key per node
  LeaseSender udp;
  ASSERT_TRUE(udp.Connect("127.0.0.1", a.lease_port()).ok());
  auto send = [&](const std::string& node, uint64_t seq, const std::string& key) {
    udp.Send(*EncodeLeaseBeat(LeaseBeat{"job", node, a.round(), seq}, key));
  };
  // Both leases age 0.3 s; a datagram renews a's: a is fresh again (age 0 on the fake clock), b
  // is not.
  fake_.Advance(std::chrono::milliseconds(300));
  send("a", 1, a.lease_key());
  ASSERT_TRUE(Eventually([&] { return SecondsSinceLease(stub_.get(), "a", server_->port()) == 0; }));
  EXPECT_DOUBLE_EQ(SecondsSinceLease(stub_.get(), "b", server_->port()), 0.3);
  // A forged datagram (another key), a replayed one, and one signed with b's key, all for a; then
  // a genuine one for b: once b is renewed, the three before it have been read, and a's lease
  // must not have moved.
  fake_.Advance(std::chrono::milliseconds(300));
  send("a", 2, std::string(kLeaseKeyBytes, 'k'));
  send("a", 1, a.lease_key());
  send("a", 99, rb.assignment().lease_key());  // b's key signs nothing for a
  send("b", 1, rb.assignment().lease_key());
  ASSERT_TRUE(Eventually([&] { return SecondsSinceLease(stub_.get(), "b", server_->port()) == 0; }));
  EXPECT_DOUBLE_EQ(SecondsSinceLease(stub_.get(), "a", server_->port()), 0.3);
  // The next genuine one for a renews it.
  send("a", 2, a.lease_key());
  ASSERT_TRUE(Eventually([&] { return SecondsSinceLease(stub_.get(), "a", server_->port()) == 0; }));
}

TEST_F(CoordinatorRpc, NoDatagramsByTheThirdHeartbeatMeansHeartbeatOnTheStream) {
  Start();
  v1::JoinResponse resp;
  ASSERT_TRUE(stub_->Join(Ctx().get(), Join("job", "a"), &resp).ok());
  As(resp);
  auto ctx = Ctx();
  auto watch = stub_->Watch(ctx.get());
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  hb.set_node_id("a");
  hb.set_round(resp.assignment().round());
  hb.set_lease_by_udp(true);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(watch->Write(hb));
  v1::HeartbeatResponse answer;
  ASSERT_TRUE(watch->Read(&answer));
  EXPECT_TRUE(answer.lease_by_stream());
  EXPECT_FALSE(answer.stop_workers());
  EXPECT_FALSE(watch->Read(&answer));
  EXPECT_TRUE(watch->Finish().ok());
  // On a stream without lease_by_udp, heartbeats alone are the lease: no such answer.
  auto ctx2 = Ctx();
  auto watch2 = stub_->Watch(ctx2.get());
  hb.set_lease_by_udp(false);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(watch2->Write(hb));
  watch2->WritesDone();
  EXPECT_FALSE(watch2->Read(&answer));
  EXPECT_TRUE(watch2->Finish().ok());
}
// The one gRPC log line that means a listener died is an event; other lines are only logged.
TEST(GrpcLogBridge, OnlyAFailedAcceptReportsADeadListener) {
  int failures = 0;
  const int id = SubscribeListenerFailures([&] { ++failures; });
  HandleGrpcLogLine("src/core/lib/iomgr/tcp_server_posix.cc", 205, GPR_LOG_SEVERITY_ERROR,
                    "Failed accept4: Too many open files");
  HandleGrpcLogLine("src/core/lib/iomgr/tcp_posix.cc", 10, GPR_LOG_SEVERITY_ERROR, "Failed accept4: elsewhere");
  HandleGrpcLogLine("src/core/lib/iomgr/tcp_server_posix.cc", 99, GPR_LOG_SEVERITY_INFO, "listening");
  EXPECT_EQ(failures, 1);
  UnsubscribeListenerFailures(id);
  HandleGrpcLogLine("src/core/lib/iomgr/tcp_server_posix.cc", 205, GPR_LOG_SEVERITY_ERROR, "Failed accept4: x");
  EXPECT_EQ(failures, 1);
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

v1::SampleRequest SampleFrom(const std::string& node, int64_t round, double busy0, double busy1) {
  v1::SampleRequest s;
  s.set_run_id("job");
  s.set_node_id(node);
  s.set_hostname("host-" + node);
  s.set_round(round);
  for (double busy : {busy0, busy1}) {
    v1::RankSample* r = s.add_ranks();
    r->set_rank(s.ranks_size() - 1);
    r->set_state("running");
    r->set_steps(100);
    r->set_step_seconds(0.3);
    r->set_busy_seconds(busy);
  }
  return s;
}

TEST_F(CoordinatorRpc, SamplesComeOnlyFromTheRunsNodesAndAnswerWithStragglerEvents) {
  Start("the-token");
  v1::SampleResponse resp;
  v1::SampleRequest sample = SampleFrom("a", 1, 0.1, 0.3);
  EXPECT_EQ(stub_->Sample(Ctx().get(), sample, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub_->Sample(Ctx("the-token").get(), sample, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::JoinResponse joined;
  v1::JoinRequest j = Join("job", "a");
  j.mutable_spec()->set_straggler_factor(1.5);
  ASSERT_TRUE(stub_->Join(Ctx("the-token").get(), j, &joined).ok());
  As(joined);
  EXPECT_EQ(stub_->Sample(Ctx("the-token").get(), SampleFrom("stranger", 1, 0.1, 0.3), &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(stub_->Sample(Ctx("the-token").get(), SampleFrom("a", 2, 0.1, 0.3), &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // a round that has not formed
  v1::SampleRequest bad = sample;
  bad.mutable_ranks(0)->set_rank(-4);
  EXPECT_EQ(stub_->Sample(Ctx("the-token").get(), bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  for (int i = 0; i < JobView::kSlowSamples; ++i) {
    resp.Clear();
    ASSERT_TRUE(stub_->Sample(Ctx("the-token").get(), sample, &resp).ok());
  }
  ASSERT_EQ(resp.events_size(), 1);
  EXPECT_EQ(resp.events(0).rank(), 1);
  EXPECT_EQ(resp.events(0).hostname(), "host-a");
  EXPECT_NEAR(resp.events(0).ratio(), 3, 1e-9);
  // Told once: a node that has seen it gets nothing more.
  sample.set_events_seen(resp.events(0).seq());
  resp.Clear();
  ASSERT_TRUE(stub_->Sample(Ctx("the-token").get(), sample, &resp).ok());
  EXPECT_EQ(resp.events_size(), 0);

  v1::StatusRequest sreq;
  sreq.set_run_id("job");
  v1::StatusResponse st;
  ASSERT_TRUE(stub_->Status(Ctx("the-token").get(), sreq, &st).ok());
  ASSERT_EQ(st.nodes_size(), 1);
  EXPECT_EQ(st.nodes(0).sample().ranks_size(), 2);
  EXPECT_THAT(st.straggling_ranks(), ::testing::ElementsAre(1));
  EXPECT_DOUBLE_EQ(st.straggler_factor(), 1.5);
}

// A replica's store, in memory: what it was asked to keep, and whether it still leads.
class MemoryStore final : public RunStore {
 public:
  absl::Status Save(const std::vector<v1::RunRecord>& records, const std::vector<std::string>& removed) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!leads) return absl::UnavailableError("another replica leads now");
    for (const auto& r : records) kept[r.run_id()] = r;
    for (const auto& id : removed) kept.erase(id);
    return absl::OkStatus();
  }
  v1::ReplicaStatus Describe() override {
    v1::ReplicaStatus s;
    s.set_replica("me:1");
    return s;
  }
  void ForwardStatus(const v1::StatusRequest&, v1::StatusResponse*, std::function<void(absl::Status)> done) override {
    done(absl::UnavailableError("forwarded"));
  }
  std::map<std::string, v1::RunRecord> Kept() {
    std::lock_guard<std::mutex> lock(mu_);
    return kept;
  }
  std::atomic<bool> leads{true};

 private:
  std::mutex mu_;
  std::map<std::string, v1::RunRecord> kept;
};

TEST_F(CoordinatorRpc, AReplicaStandsByLeadsWithWhatWasKeptAndAnswersNothingItCouldNotKeep) {
  Start();
  MemoryStore store;
  server_->service()->set_store(&store);
  // Standing by: every call is refused, naming the leader; Status is forwarded.
  server_->service()->StandBy("10.0.0.1:29400");
  v1::JoinResponse resp;
  grpc::Status st = stub_->Join(Ctx().get(), Join("job", "a"), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), HasSubstr("stands by; the leader is at 10.0.0.1:29400"));
  v1::StatusRequest sreq;
  sreq.set_run_id("job");
  v1::StatusResponse status;
  st = stub_->Status(Ctx().get(), sreq, &status);
  EXPECT_THAT(st.error_message(), HasSubstr("forwarded"));

  // Leading: a round that forms is kept before its join is answered.
  server_->service()->Lead({});
  ASSERT_TRUE(stub_->Join(Ctx().get(), Join("job", "a"), &resp).ok());
  As(resp);
  auto kept = store.Kept();
  ASSERT_EQ(kept.count("job"), 1u);
  EXPECT_EQ(kept["job"].round(), 1);
  EXPECT_EQ(kept["job"].lease_key().size(), kLeaseKeyBytes);  // the run's: a new leader's datagram keys agree
  ASSERT_EQ(kept["job"].members_size(), 1);

  // Another replica took over: what this one cannot keep, it does not answer.
  store.leads = false;
  v1::JoinResponse other;
  st = stub_->Join(Ctx().get(), Join("job2", "b"), &other);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), HasSubstr("could not keep the run's state"));

  // A replica that leads again carries on what was kept (the run's key with it: the node's key
  // still speaks for it), and its members' heartbeats are answered.
  server_->service()->StandBy("");
  server_->service()->Lead({kept["job"]});
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  hb.set_node_id("a");
  hb.set_round(1);
  v1::HeartbeatResponse hr;
  ASSERT_TRUE(stub_->Heartbeat(Ctx().get(), hb, &hr).ok());
  EXPECT_FALSE(hr.unknown_node());
  EXPECT_EQ(hr.current_round(), 1);
  EXPECT_FALSE(hr.stop_workers());
}

TEST_F(CoordinatorRpc, AStragglerFactorOutOfRangeIsRefusedAtTheJoin) {
  Start();
  v1::JoinResponse resp;
  v1::JoinRequest j = Join("job", "a");
  j.mutable_spec()->set_straggler_factor(0.5);
  auto st = stub_->Join(Ctx().get(), j, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("straggler factor 0.5: expected 0 (off) or 1-1000"));
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

// Within the token's trust, one node must not act as another: every call that names a node after
// its join needs that node's key (its assignment's lease key), which only its join was answered with.
TEST_F(CoordinatorRpc, ANodesKeyDoesNotSpeakForAnotherNode) {
  Start("the-token");
  v1::JoinRequest ja = Join("job", "a"), jb = Join("job", "b");
  for (v1::JoinRequest* j : {&ja, &jb}) {
    j->mutable_spec()->set_min_nodes(2);
    j->mutable_spec()->set_max_nodes(2);
  }
  v1::JoinResponse ra, rb;
  std::thread join_a([&] { ASSERT_TRUE(stub_->Join(Ctx("the-token").get(), ja, &ra).ok()); });
  ASSERT_TRUE(stub_->Join(Ctx("the-token").get(), jb, &rb).ok());
  join_a.join();
  ASSERT_NE(ra.assignment().lease_key(), rb.assignment().lease_key());
  const long round = ra.assignment().round();
  v1::ReportExitRequest forged;
  forged.set_run_id("job");
  forged.set_node_id("a");
  forged.set_round(round);
  forged.add_exits()->set_exit_code(9);
  v1::HeartbeatRequest hb;
  hb.set_run_id("job");
  hb.set_node_id("a");
  hb.set_round(round);
  v1::SampleRequest sample = SampleFrom("a", round, 0.1, 0.1);
  for (const std::string& key : {std::string(), rb.assignment().lease_key()}) {
    node_key_ = key;  // none, then b's
    v1::ReportExitResponse rresp;
    grpc::Status st = stub_->ReportExit(Ctx("the-token").get(), forged, &rresp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("node key (x-launch-node-key-bin) for node a"));
    v1::HeartbeatResponse hresp;
    EXPECT_EQ(stub_->Heartbeat(Ctx("the-token").get(), hb, &hresp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    v1::SampleResponse sresp;
    EXPECT_EQ(stub_->Sample(Ctx("the-token").get(), sample, &sresp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    auto ctx = Ctx("the-token");
    auto watch = stub_->Watch(ctx.get());
    ASSERT_TRUE(watch->Write(hb));
    v1::HeartbeatResponse ignored;
    EXPECT_FALSE(watch->Read(&ignored));
    EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  // The forged failure did nothing: the run is in its first round, its restart count 0.
  v1::StatusRequest sreq;
  sreq.set_run_id("job");
  v1::StatusResponse status;
  ASSERT_TRUE(stub_->Status(Ctx("the-token").get(), sreq, &status).ok());
  EXPECT_EQ(status.state(), "running");
  EXPECT_EQ(status.restart_count(), 0);
  EXPECT_FALSE(status.has_first_failure());
  // a's own key speaks for a.
  As(ra);
  v1::HeartbeatResponse hresp;
  EXPECT_TRUE(stub_->Heartbeat(Ctx("the-token").get(), hb, &hresp).ok());
  v1::SampleResponse sresp;
  EXPECT_TRUE(stub_->Sample(Ctx("the-token").get(), sample, &sresp).ok());
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

// Runs per coordinator are bounded (each re-registration of a new run id made one), and what one
// request writes to the log is bounded whatever its strings: every wire string cut to 64 bytes.
TEST(StatusOnTheWire, TheLargestRunIsCutToTheLimitInRankOrderWithoutAddresses) {
  // A small run: every node, without its addresses.
  v1::StatusResponse small;
  for (int i = 0; i < 3; ++i) {
    auto* n = small.add_nodes();
    n->set_group_rank(i);
    n->mutable_node()->add_addresses("10.0.0.1");
  }
  BoundStatusForWire(&small, kMaxStatusNodesBytes);
  EXPECT_EQ(small.nodes_size(), 3);
  EXPECT_EQ(small.nodes_omitted(), 0);
  for (const auto& n : small.nodes()) EXPECT_EQ(n.node().addresses_size(), 0);
  // The largest run, every name and address at its longest.
  v1::StatusResponse s;
  s.set_run_id(std::string(kMaxRunIdLength, 'r'));
  s.set_reason(std::string(4096, 'x'));
  for (int i = 0; i < kMaxNodes; ++i) {
    auto* n = s.add_nodes();
    n->set_group_rank(i);
    const std::string id = absl::StrCat(i, ":");
    n->mutable_node()->set_node_id(id + std::string(kMaxNodeIdLength - id.size(), 'n'));
    n->mutable_node()->set_hostname(std::string(kMaxHostLength, 'h'));
    for (int a = 0; a < kMaxNodeAddresses; ++a) n->mutable_node()->add_addresses(std::string(kMaxAddressLength, 'a'));
  }
  BoundStatusForWire(&s, kMaxStatusNodesBytes);
  EXPECT_LE(s.ByteSizeLong(), kMaxStatusNodesBytes);
  ASSERT_GT(s.nodes_size(), 1000);
  EXPECT_EQ(s.nodes_size() + s.nodes_omitted(), kMaxNodes);
  for (int i = 0; i < s.nodes_size(); ++i) {
    EXPECT_EQ(s.nodes(i).group_rank(), i);
    EXPECT_EQ(s.nodes(i).node().addresses_size(), 0);
  }
  EXPECT_EQ(s.reason().size(), 4096u);  // the rest is kept whole
}

TEST_F(CoordinatorRpc, RunsAreBoundedAndARequestsLogLinesAreShort) {
  Start();
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  v1::HeartbeatRequest hb;
  hb.set_round(1);
  *hb.mutable_node() = Join("job", std::string(kMaxNodeIdLength, 'n')).node();
  hb.mutable_node()->set_hostname(std::string(kMaxHostLength, 'h'));
  hb.mutable_node()->set_host_address(std::string(kMaxHostLength, 'i'));
  *hb.mutable_spec() = Join("job", "a").spec();
  hb.mutable_spec()->set_max_nodes(kMaxNodes);
  hb.mutable_assignment()->set_round(1);
  hb.mutable_assignment()->set_group_world_size(kMaxNodes);
  hb.mutable_assignment()->set_group_rank(kMaxNodes - 1);
  hb.mutable_assignment()->set_world_size(kMaxNodes);
  hb.mutable_assignment()->set_lease_key(std::string(kLeaseKeyBytes, 'k'));
  node_key_ = hb.assignment().lease_key();
  for (int i = 0; i <= kMaxRunsPerCoordinator; ++i) {
    hb.set_run_id(absl::StrCat(std::string(100, 'r'), i));
    hb.set_node_id(absl::StrCat(std::string(kMaxNodeIdLength - 8, 'n'), i));
    hb.mutable_node()->set_node_id(hb.node_id());
    const size_t logged = log.str().size();
    v1::HeartbeatResponse resp;
    grpc::Status st = stub_->Heartbeat(Ctx().get(), hb, &resp);
    spdlog::default_logger()->flush();
    EXPECT_LT(log.str().size() - logged, 700u) << log.str().substr(logged);
    if (i < kMaxRunsPerCoordinator) {
      ASSERT_TRUE(st.ok()) << i << ": " << st.error_message();
      continue;
    }
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(st.error_message(), HasSubstr(absl::StrCat("holds ", kMaxRunsPerCoordinator, " runs, its limit")));
  }
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(server_->service()->runs_for_test(), kMaxRunsPerCoordinator);
  EXPECT_EQ(log.str().find(std::string(65, 'n')), std::string::npos);
  EXPECT_EQ(log.str().find(std::string(65, 'h')), std::string::npos);
}

}  // namespace
}  // namespace launch
