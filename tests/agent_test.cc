// The agent against a fake coordinator client (no gRPC, no coordinator), with real workers.
#include "agent/agent.h"

#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace launch {
namespace {

using testing::ProcessAlive;
using testing::ReadPids;
using testing::TempDir;
using testing::WaitUntil;

const std::string kWorker = TEST_WORKER_BIN;

// A Watch stream that never answers: the coordinator has nothing to say until cancelled.
class SilentStream : public WatchStream {
 public:
  bool Send(const v1::HeartbeatRequest&) override { return true; }
  bool Receive(v1::HeartbeatResponse*) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return cancelled_; });
    return false;
  }
  absl::Status Finish() override { return absl::CancelledError("cancelled"); }
  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
};

// One node alone in round 1; its exit reports are recorded and answered by `on_report`.
class FakeCoordinator : public CoordinatorClient {
 public:
  std::unique_ptr<WatchStream> Watch() override { return std::make_unique<SilentStream>(); }
  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req, CallCanceller*) override {
    v1::Assignment a;
    a.set_round(1);
    a.set_group_world_size(1);
    a.set_world_size(req.node().local_world_size());
    a.set_master_addr("127.0.0.1");
    a.set_master_port(req.proposed_master_port());
    return a;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&) override {
    return v1::HeartbeatResponse();
  }
  absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req,
                                                    std::chrono::milliseconds) override {
    const int n = ++reports_;
    if (on_report) on_report(n, req);
    v1::ReportExitResponse resp;
    resp.set_job_failed(!req.group_succeeded());
    resp.set_job_succeeded(req.group_succeeded());
    return resp;
  }
  std::string target() const override { return "fake"; }

  std::function<void(int, const v1::ReportExitRequest&)> on_report;
  std::atomic<int> reports_{0};
};

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BlockLauncherSignals();
    auto s = SignalFd::Create();
    ASSERT_TRUE(s.ok());
    signals_.emplace(std::move(*s));
  }
  AgentOptions Options(int nproc, std::vector<std::string> worker_args) {
    AgentOptions o;
    o.spec.local_world_size = nproc;
    o.spec.run_id = "agent-test";
    o.argv = {kWorker};
    o.argv.insert(o.argv.end(), worker_args.begin(), worker_args.end());
    o.node.set_node_id("node-a");
    o.node.set_hostname("node-a");
    o.node.set_local_world_size(nproc);
    o.run_spec.set_join_timeout_s(10);
    return o;
  }
  std::optional<SignalFd> signals_;
  PosixProcessLauncher launcher_;
  SystemClock clock_;
};

// The early failure report made a synchronous RPC inside the supervision loop: a coordinator slow
// to answer held up reaping and the stop timer. Here the coordinator answers the early report
// only once the SIGTERM-ignoring worker is dead, which takes the stop timer's SIGKILL.
TEST_F(AgentTest, TheEarlyFailureReportDoesNotHoldUpTheGroup) {
  TempDir dir;
  const std::string pids = dir / "pids";
  // Both ignore SIGTERM and are running before rank 1 fails.
  AgentOptions o = Options(2, {"--ignore-sigterm", "--pid-file", pids, "--wait-lines", pids, "2", "--fail-rank", "1",
                               "3", "--sleep", "0"});
  o.stop_timeout = std::chrono::milliseconds(200);
  FakeCoordinator coord;
  std::atomic<bool> survivor_died_while_report_waited{false};
  coord.on_report = [&](int n, const v1::ReportExitRequest& req) {
    if (n != 1) return;
    ASSERT_EQ(req.exits_size(), 1);
    const pid_t failed = req.exits(0).pid();
    survivor_died_while_report_waited = WaitUntil([&] {
      auto all = ReadPids(pids);
      if (all.size() < 2) return false;
      for (pid_t p : all)
        if (p != failed && ProcessAlive(p)) return false;
      return true;
    }, std::chrono::seconds(20));
  };
  Agent agent(o, &coord, &launcher_, nullptr, &*signals_, &clock_);
  EXPECT_EQ(agent.Run(), 3);
  EXPECT_TRUE(survivor_died_while_report_waited);
  EXPECT_EQ(coord.reports_, 2);  // the early report, then the group's
}

}  // namespace
}  // namespace launch
