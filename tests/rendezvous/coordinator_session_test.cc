// The agent's retry, patience and re-registration policy (CoordinatorSession) against a scripted
// coordinator client, on a fake clock: every wait advances the clock instead of sleeping.
#include "rendezvous/coordinator_session.h"

#include <poll.h>
#include <signal.h>

#include <deque>
#include <functional>
#include <limits>
#include <vector>

#include "common/clock.h"
#include "rendezvous/coordinator_watch.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_coordinator_client.h"

namespace launch {
namespace {

using std::chrono::milliseconds;

// A round as a coordinator makes it: node 1 of 2, 4 ranks a node.
v1::Assignment GoodAssignment() {
  v1::Assignment a;
  a.set_round(3);
  a.set_group_rank(1);
  a.set_group_world_size(2);
  a.set_world_size(8);
  a.set_rank_offset(4);
  a.set_master_addr("10.0.0.1");
  a.set_master_port(29500);
  a.set_restart_count(1);
  a.set_max_restarts(3);
  a.add_member_addresses("10.0.0.1");
  a.add_member_addresses("10.0.0.2");
  return a;
}

class SessionTest : public ::testing::Test {
 protected:
  SessionTest() { client_.target_name = "10.0.0.1:29400"; }
  CoordinatorSession Session(milliseconds patience = milliseconds(30000), double join_timeout_s = 600) {
    CoordinatorSession::Options o;
    o.run_id = "job";
    o.node.set_node_id("node-b");
    o.node.set_local_world_size(4);
    o.spec.set_join_timeout_s(join_timeout_s);
    o.spec.set_min_nodes(2);
    o.patience = patience;
    // A wait on a descriptor is a real wait (the join runs on a thread); a timed wait advances the
    // fake clock at once. `signal_at_wait`: the n-th timed wait is cut short by SIGTERM.
    return CoordinatorSession(o, &client_, &clock_, [this](int fd, std::optional<milliseconds> t) {
      if (fd >= 0) {
        pollfd p{fd, POLLIN, 0};
        ::poll(&p, 1, -1);
        return 0;
      }
      waits_.push_back(*t);
      if (static_cast<int>(waits_.size()) == signal_at_wait_) return SIGTERM;
      clock_.Advance(*t);
      return -1;
    });
  }
  std::function<absl::StatusOr<v1::JoinRequest>()> Request() {
    return [] { return v1::JoinRequest(); };
  }

  testing::FakeCoordinatorClient client_;
  FakeClock clock_;
  std::vector<milliseconds> waits_;
  int signal_at_wait_ = -1;
};

TEST(RetryPacer, DoublesUpToTheMaximumAndStartsOverOnceReached) {
  FakeClock clock;
  RetryPacer p({milliseconds(50), milliseconds(300)}, &clock);
  EXPECT_FALSE(p.unreachable());
  EXPECT_EQ(p.Unreachable(), milliseconds(50));
  clock.Advance(milliseconds(50));
  EXPECT_EQ(p.Unreachable(), milliseconds(100));
  EXPECT_EQ(p.Unreachable(), milliseconds(200));
  EXPECT_EQ(p.Unreachable(), milliseconds(300));
  EXPECT_EQ(p.Unreachable(), milliseconds(300));
  EXPECT_EQ(p.unreachable_for(), milliseconds(50));  // since the first failed try
  p.Reached();
  EXPECT_FALSE(p.unreachable());
  EXPECT_EQ(p.unreachable_for(), Clock::Duration::zero());
  EXPECT_EQ(p.Unreachable(), milliseconds(50));
}

TEST_F(SessionTest, AJoinRidesOutACoordinatorThatComesBack) {
  for (int i = 0; i < 5; ++i) client_.joins.push_back(absl::UnavailableError("connection refused"));
  client_.joins.push_back(GoodAssignment());
  CoordinatorSession s = Session();
  int sig = 0;
  auto got = s.Join(Request(), &sig);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->round(), 3);
  EXPECT_EQ(waits_, (std::vector<milliseconds>{milliseconds(50), milliseconds(100), milliseconds(200),
                                               milliseconds(400), milliseconds(800)}));
}

TEST_F(SessionTest, AJoinEndsAtTheJoinTimeout) {
  CoordinatorSession s = Session(milliseconds(30000), /*join_timeout_s=*/10);
  int sig = 0;
  auto got = s.Join(Request(), &sig);
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_GE(clock_.Now().time_since_epoch(), std::chrono::seconds(10));
  EXPECT_LT(clock_.Now().time_since_epoch(), std::chrono::seconds(13));  // within one capped delay
}

TEST_F(SessionTest, AJoinGivesUpOnAGoneHostedCoordinatorAfterThePatience) {
  CoordinatorSession s = Session(milliseconds(5000));
  s.set_coordinator_host("node-a");
  int sig = 0;
  auto got = s.Join(Request(), &sig);
  ASSERT_TRUE(absl::IsUnavailable(got.status()));
  EXPECT_NE(got.status().message().find("hosted by the agent of node-a"), std::string::npos) << got.status();
  EXPECT_LT(clock_.Now().time_since_epoch(), std::chrono::seconds(10));  // not the 600 s join timeout
}

TEST_F(SessionTest, ARefusedJoinIsNotRetried) {
  client_.joins.push_back(absl::PermissionDeniedError("wrong token"));
  CoordinatorSession s = Session();
  int sig = 0;
  auto got = s.Join(Request(), &sig);
  EXPECT_TRUE(absl::IsPermissionDenied(got.status()));
  EXPECT_EQ(client_.join_calls(), 1);
  EXPECT_TRUE(waits_.empty());
}

// Every number of an assignment is wire input: checked before it names a rank, a port or sizes
// anything. Each row breaks one field of a good assignment; the error names the field and value.
TEST(ValidateAssignment, EachFieldOutOfItsRangeIsNamed) {
  ASSERT_TRUE(ValidateAssignment(GoodAssignment(), 4).ok());
  struct Row {
    const char* field;
    std::function<void(v1::Assignment*)> bad;
  };
  const std::vector<Row> rows = {
      {"round 0", [](v1::Assignment* a) { a->set_round(0); }},
      {"round 9223372036854775807", [](v1::Assignment* a) { a->set_round(std::numeric_limits<int64_t>::max()); }},
      {"group_world_size 0", [](v1::Assignment* a) { a->set_group_world_size(0); }},
      {"group_world_size 16385", [](v1::Assignment* a) { a->set_group_world_size(16385); }},
      {"group_rank 2", [](v1::Assignment* a) { a->set_group_rank(2); }},
      {"group_rank -1", [](v1::Assignment* a) { a->set_group_rank(-1); }},
      {"world_size 3", [](v1::Assignment* a) { a->set_world_size(3); }},
      {"world_size 8193", [](v1::Assignment* a) { a->set_world_size(8193); }},
      {"rank_offset 2147483647", [](v1::Assignment* a) { a->set_rank_offset(2147483647); }},
      {"rank_offset 5", [](v1::Assignment* a) { a->set_rank_offset(5); }},
      {"rank_offset -4", [](v1::Assignment* a) { a->set_rank_offset(-4); }},
      {"master_addr of 0", [](v1::Assignment* a) { a->clear_master_addr(); }},
      {"master_addr of 300", [](v1::Assignment* a) { a->set_master_addr(std::string(300, 'h')); }},
      {"master_port 0", [](v1::Assignment* a) { a->set_master_port(0); }},
      {"master_port 70000", [](v1::Assignment* a) { a->set_master_port(70000); }},
      {"max_restarts -1", [](v1::Assignment* a) { a->set_max_restarts(-1); }},
      {"restart_count 4", [](v1::Assignment* a) { a->set_restart_count(4); }},
      {"restart_count -1", [](v1::Assignment* a) { a->set_restart_count(-1); }},
      {"lease_port 65536", [](v1::Assignment* a) { a->set_lease_port(65536); }},
      {"coordinator_host of 400", [](v1::Assignment* a) { a->set_coordinator_host(std::string(400, 'c')); }},
      {"member_addresses: 131",
       [](v1::Assignment* a) {  // 2 nodes: 64 interfaces and a host address each
         for (int i = 0; i < 129; ++i) a->add_member_addresses("10.0.0.3");
       }},
      {"member address of 65", [](v1::Assignment* a) { a->add_member_addresses(std::string(65, '1')); }},
  };
  for (const Row& row : rows) {
    v1::Assignment a = GoodAssignment();
    row.bad(&a);
    absl::Status st = ValidateAssignment(a, 4);
    EXPECT_TRUE(absl::IsFailedPrecondition(st)) << row.field << ": " << st;
    EXPECT_NE(st.message().find(row.field), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  }
}

// A coordinator that hands out an impossible assignment is not retried: the join fails naming it.
TEST_F(SessionTest, AJoinAnsweredWithAnImpossibleAssignmentFailsAndIsNotRetried) {
  v1::Assignment a = GoodAssignment();
  a.set_rank_offset(2147483647);
  client_.joins.push_back(a);
  CoordinatorSession s = Session();
  int sig = 0;
  auto got = s.Join(Request(), &sig);
  ASSERT_TRUE(absl::IsFailedPrecondition(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("10.0.0.1:29400: the coordinator's assignment has rank_offset 2147483647"),
            std::string::npos)
      << got.status();
  EXPECT_EQ(client_.join_calls(), 1);
}

TEST_F(SessionTest, ASignalCutsTheRetriesShort) {
  signal_at_wait_ = 2;
  CoordinatorSession s = Session();
  int sig = 0;
  auto got = s.Join(Request(), &sig);
  EXPECT_TRUE(absl::IsCancelled(got.status()));
  EXPECT_EQ(sig, SIGTERM);
  EXPECT_EQ(client_.join_calls(), 2);
}

TEST_F(SessionTest, AReportReRegistersWithACoordinatorThatForgotTheRun) {
  client_.reports.push_back(absl::NotFoundError("no run 'job'"));
  v1::ReportExitResponse verdict;
  verdict.set_restart(true);
  client_.reports.push_back(verdict);
  CoordinatorSession s = Session();
  v1::Assignment a;
  a.set_round(4);
  a.set_group_rank(1);
  int sig = 0;
  auto got = s.Report(v1::ReportExitRequest(), a, &sig);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->restart());
  ASSERT_EQ(client_.heartbeats().size(), 1u);
  const v1::HeartbeatRequest hb = client_.heartbeats()[0];
  EXPECT_EQ(hb.run_id(), "job");
  EXPECT_EQ(hb.node().node_id(), "node-b");
  EXPECT_EQ(hb.assignment().group_rank(), 1);
  EXPECT_EQ(hb.spec().min_nodes(), 2);
  EXPECT_TRUE(waits_.empty());
}

TEST_F(SessionTest, AReportGivesUpAfterThePatience) {
  CoordinatorSession s = Session(milliseconds(4000));
  int sig = 0;
  auto got = s.Report(v1::ReportExitRequest(), v1::Assignment(), &sig);
  ASSERT_TRUE(absl::IsUnavailable(got.status()));
  EXPECT_NE(got.status().message().find("gave up on the coordinator at 10.0.0.1:29400 after 4 s"), std::string::npos)
      << got.status();
  EXPECT_GE(clock_.Now().time_since_epoch(), std::chrono::seconds(4));
  EXPECT_LT(clock_.Now().time_since_epoch(), std::chrono::seconds(7));
}

// What the watch makes of each answer on its stream: an unknown node registers again, a word that
// the datagrams do not arrive moves the heartbeats to the stream (unless the workers must stop
// anyway), everything else is the agent's to act on.
TEST(CoordinatorWatch, EachAnswerOnTheStreamIsActedOnAsItSays) {
  struct Case {
    bool unknown_node, lease_by_stream, stop_workers, job_succeeded, job_failed;
    WatchAnswer want;
  };
  const std::vector<Case> cases = {
      {true, false, false, false, false, WatchAnswer::kReregister},
      {true, true, true, false, false, WatchAnswer::kReregister},
      {false, true, false, false, false, WatchAnswer::kHeartbeatOnStream},
      {false, true, true, false, false, WatchAnswer::kDeliver},
      {false, true, false, true, false, WatchAnswer::kDeliver},
      {false, true, false, false, true, WatchAnswer::kDeliver},
      {false, false, true, false, false, WatchAnswer::kDeliver},
      {false, false, false, true, false, WatchAnswer::kDeliver},
      {false, false, false, false, false, WatchAnswer::kDeliver},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    v1::HeartbeatResponse r;
    r.set_unknown_node(c.unknown_node);
    r.set_lease_by_stream(c.lease_by_stream);
    r.set_stop_workers(c.stop_workers);
    r.set_job_succeeded(c.job_succeeded);
    r.set_job_failed(c.job_failed);
    EXPECT_EQ(ClassifyWatchAnswer(r), c.want) << "case " << i << ": " << r.ShortDebugString();
  }
}

// ---- The watch on simulated time: its thread waits on the clock, and the test moves it ----

class WatchTest : public ::testing::Test {
 protected:
  WatchTest() { client_.target_name = "10.0.0.1:29400"; }
  CoordinatorSession Session(milliseconds patience) {
    CoordinatorSession::Options o;
    o.run_id = "job";
    o.node.set_node_id("node-b");
    o.patience = patience;
    o.retry.first = milliseconds(1000);
    o.retry.max = milliseconds(4000);
    return CoordinatorSession(o, &client_, &clock_, [](int, std::optional<milliseconds>) { return -1; });
  }
  static bool Readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
  testing::FakeCoordinatorClient client_;
  SimulatedClock clock_;
};

// A heartbeat on the stream when the watch starts, then one each interval from the last: a jump
// of several intervals sends one, not one for each.
TEST_F(WatchTest, HeartbeatsGoOnTheStreamEveryIntervalOfTheClock) {
  CoordinatorSession session = Session(milliseconds(30000));
  CoordinatorWatch watch(&session, milliseconds(1000));
  v1::Assignment a;
  a.set_round(1);
  ASSERT_TRUE(watch.Start(a).ok());
  ASSERT_TRUE(clock_.AwaitWaits(1));
  EXPECT_EQ(client_.stream_heartbeats(), 1);
  clock_.Advance(milliseconds(999));
  clock_.Advance(milliseconds(1));
  ASSERT_TRUE(clock_.AwaitWaits(2));
  EXPECT_EQ(client_.stream_heartbeats(), 2);
  clock_.Advance(milliseconds(5000));
  ASSERT_TRUE(clock_.AwaitWaits(3));
  EXPECT_EQ(client_.stream_heartbeats(), 3);
  EXPECT_EQ(client_.watch_calls(), 1);
  EXPECT_FALSE(Readable(watch.fd()));
  watch.Stop();
  EXPECT_EQ(clock_.waits(), 3u);  // stopped in its wait, without another
}

// A coordinator hosted by another node's agent that stays unreachable: the watch retries at the
// session's pace (1, 2, 4, 4 s) and, once it has been gone for the patience, tells the agent the
// job failed, naming the host.
TEST_F(WatchTest, AHostedCoordinatorGoneForThePatienceFailsTheJobAtThePacersSteps) {
  client_.unreachable_watches = 1000;
  CoordinatorSession session = Session(milliseconds(10000));
  CoordinatorWatch watch(&session, milliseconds(1000));
  v1::Assignment a;
  a.set_round(1);
  a.set_coordinator_host("node-a");
  ASSERT_TRUE(watch.Start(a).ok());
  const std::vector<milliseconds> steps = {milliseconds(1000), milliseconds(2000), milliseconds(4000),
                                           milliseconds(4000)};
  for (size_t i = 0; i < steps.size(); ++i) {
    ASSERT_TRUE(clock_.AwaitWaits(i + 1));
    EXPECT_EQ(client_.watch_calls(), static_cast<int>(i + 1));
    EXPECT_TRUE(watch.unreachable());
    EXPECT_FALSE(Readable(watch.fd())) << "at step " << i;
    clock_.Advance(steps[i] - milliseconds(1));
    EXPECT_EQ(client_.watch_calls(), static_cast<int>(i + 1)) << "a retry came early, at step " << i;
    clock_.Advance(milliseconds(1));
  }
  // 11 s unreachable at the fifth try: past the 10 s patience.
  pollfd p{watch.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 60000), 1);
  EXPECT_EQ(client_.watch_calls(), 5);
  const v1::HeartbeatResponse answer = watch.answer();
  EXPECT_TRUE(answer.stop_workers());
  EXPECT_TRUE(answer.job_failed());
  EXPECT_NE(answer.reason().find("hosted by the agent of node-a"), std::string::npos) << answer.reason();
}

}  // namespace
}  // namespace launch
