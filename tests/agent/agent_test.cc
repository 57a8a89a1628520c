// The agent against a fake coordinator client (no gRPC, no coordinator): with a fake launcher (no
// processes, microseconds) for its phases and decisions, and with real workers where timing with
// real processes is the point.
#include "agent/agent.h"

#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_process_launcher.h"
#include "tests/fakes/fake_coordinator_client.h"
#include "tests/test_util.h"

namespace launch {
namespace {

using testing::ProcessAlive;
using testing::ReadPids;
using testing::TempDir;
using testing::FakeProcessLauncher;
using testing::FakeCoordinatorClient;
using testing::WaitUntil;

const std::string kWorker = TEST_WORKER_BIN;

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

// ---- The agent with real workers ----

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
  FakeCoordinatorClient coord;
  coord.answer_unscripted = true;
  std::atomic<bool> survivor_died_while_report_waited{false};
  std::atomic<int> reports{0};
  coord.on_report = [&](const v1::ReportExitRequest& req) {
    v1::ReportExitResponse verdict;
    verdict.set_job_failed(!req.group_succeeded());
    if (++reports != 1) return verdict;
    EXPECT_EQ(req.exits_size(), 1);
    if (req.exits_size() != 1) return verdict;
    const pid_t failed = req.exits(0).pid();
    survivor_died_while_report_waited = WaitUntil(
        [&] {
          auto all = ReadPids(pids);
          if (all.size() < 2) return false;
          for (pid_t p : all)
            if (p != failed && ProcessAlive(p)) return false;
          return true;
        },
        std::chrono::seconds(20));
    return verdict;
  };
  Agent agent(o, &coord, &launcher_, nullptr, &*signals_, &clock_);
  EXPECT_EQ(agent.Run(), 3);
  EXPECT_TRUE(survivor_died_while_report_waited);
  EXPECT_EQ(coord.reported().size(), 2u);  // the early report, then the group's
}

// ---- The agent with a fake launcher: its phases and decisions, no processes ----

v1::ReportExitResponse Succeeded() {
  v1::ReportExitResponse r;
  r.set_job_succeeded(true);
  return r;
}

bool HasEnv(const SpawnOptions& so, const std::string& kv) {
  return std::find(so.env.begin(), so.env.end(), kv) != so.env.end();
}

class FakeAgentTest : public AgentTest {
 protected:
  // Rounds formed by each join, reports answered "carry on" unless a test says otherwise.
  FakeAgentTest() { coord_.answer_unscripted = true; }
  // On simulated time: the group's loop, the agent's own waits and the watch's thread move a
  // clock no one waits for in real time.
  int RunAgent(const AgentOptions& o) {
    Agent agent(o, &coord_, &fake_, nullptr, &*signals_, &sim_);
    return agent.Run();
  }
  static FakeProcessLauncher::Script Exits(int code) {
    FakeProcessLauncher::Script s;
    s.exit_at_start = code;
    return s;
  }
  FakeCoordinatorClient coord_;
  FakeProcessLauncher fake_;
  SimulatedClock sim_;
};

TEST_F(FakeAgentTest, AFailureWithRestartsLeftRunsTheGroupAgain) {
  fake_.script = [](int n, const SpawnOptions&) { return Exits(n == 1 ? 3 : 0); };  // attempt 1: rank 1 fails
  coord_.on_report = [](const v1::ReportExitRequest& req) {
    if (req.group_succeeded()) return Succeeded();
    v1::ReportExitResponse r;
    r.set_restart(true);
    r.set_restart_count(1);
    return r;
  };
  EXPECT_EQ(RunAgent(Options(2, {})), 0);
  EXPECT_EQ(coord_.join_calls(), 2);
  ASSERT_EQ(fake_.spawned().size(), 4u);
  EXPECT_TRUE(HasEnv(fake_.spawned()[0], "TORCHELASTIC_RESTART_COUNT=0"));
  EXPECT_TRUE(HasEnv(fake_.spawned()[2], "TORCHELASTIC_RESTART_COUNT=1"));
  // The failure was reported early (rank 1 only), then with the group's other exits.
  const auto reports = coord_.reported();
  ASSERT_GE(reports.size(), 3u);
  EXPECT_EQ(reports[0].exits_size(), 1);
  EXPECT_EQ(reports[0].exits(0).rank(), 1);
  EXPECT_EQ(reports[1].exits(0).rank(), 1);  // the root cause first
  EXPECT_EQ(reports[1].exits(0).exit_code(), 3);
}

TEST_F(FakeAgentTest, NoRestartLeftExitsWithTheRootCausesCode) {
  fake_.script = [](int n, const SpawnOptions&) { return Exits(n == 0 ? 7 : 0); };
  coord_.on_report = [](const v1::ReportExitRequest&) {
    v1::ReportExitResponse r;
    r.set_job_failed(true);
    return r;
  };
  EXPECT_EQ(RunAgent(Options(2, {})), 7);
  EXPECT_EQ(coord_.join_calls(), 1);
}

TEST_F(FakeAgentTest, TheCoordinatorsStopEndsTheRoundAndTheNextOneRuns) {
  fake_.script = [](int n, const SpawnOptions&) {
    // Round 1's workers run until stopped; round 2's exit 0.
    return n < 2 ? FakeProcessLauncher::Script() : Exits(0);
  };
  coord_.on_watch = [](int n) -> std::optional<v1::HeartbeatResponse> {
    if (n != 1) return std::nullopt;
    v1::HeartbeatResponse r;
    r.set_stop_workers(true);
    r.set_reason("node-c left");
    return r;
  };
  coord_.on_report = [](const v1::ReportExitRequest& req) {
    return req.group_succeeded() ? Succeeded() : v1::ReportExitResponse();
  };
  EXPECT_EQ(RunAgent(Options(2, {})), 0);
  EXPECT_EQ(coord_.join_calls(), 2);
  ASSERT_EQ(fake_.spawned().size(), 4u);
  EXPECT_EQ(fake_.SignalsTo(1000), std::vector<int>{SIGTERM});
  EXPECT_EQ(coord_.reported()[0].exits_size(), 0);  // stopped, not failed: nothing to blame
}

TEST_F(FakeAgentTest, ANodeDoneFirstWaitsForTheJobsVerdict) {
  fake_.script = [](int, const SpawnOptions&) { return Exits(0); };
  coord_.on_report = [](const v1::ReportExitRequest&) { return v1::ReportExitResponse(); };  // others still run
  coord_.on_watch = [](int n) -> std::optional<v1::HeartbeatResponse> {
    if (n != 2) return std::nullopt;  // the watch while waiting for the others
    v1::HeartbeatResponse r;
    r.set_job_succeeded(true);
    return r;
  };
  EXPECT_EQ(RunAgent(Options(1, {})), 0);
  EXPECT_EQ(coord_.join_calls(), 1);
}

TEST_F(FakeAgentTest, ASignalDuringTheRestartBackoffEndsTheRunWithItsCode) {
  fake_.script = [](int, const SpawnOptions&) { return Exits(1); };
  const std::thread::id agent_thread = std::this_thread::get_id();
  coord_.on_report = [agent_thread](const v1::ReportExitRequest&) {
    // The early report comes from a thread of its own; the group's report from the agent's.
    if (std::this_thread::get_id() != agent_thread) return v1::ReportExitResponse();
    v1::ReportExitResponse r;
    r.set_restart(true);
    ::raise(SIGTERM);  // pending on the agent's signal fd when the backoff starts waiting
    return r;
  };
  AgentOptions o = Options(1, {});
  o.restart_backoff = std::chrono::hours(1);
  EXPECT_EQ(RunAgent(o), 128 + SIGTERM);
  EXPECT_EQ(coord_.join_calls(), 1);
  // The signal may be left pending (the backoff looks without reading): the next test of this
  // process must not get it.
  while (signals_->Read() != 0) {
  }
  EXPECT_EQ(signals_->Pending(), 0);
}

// Every node stopped at once: the end of the job (here a worker's failure the coordinator ends
// the job for) can come a moment before launch's own SIGTERM is read. The signal ended the run.
TEST_F(FakeAgentTest, ASignalThatCameAsTheRunEndedIsItsExitCode) {
  fake_.script = [](int, const SpawnOptions&) { return Exits(1); };
  const std::thread::id agent_thread = std::this_thread::get_id();
  coord_.on_report = [agent_thread](const v1::ReportExitRequest&) {
    v1::ReportExitResponse r;
    if (std::this_thread::get_id() == agent_thread) ::raise(SIGTERM);  // pending, not read
    return r;                                                          // no restart: the job failed
  };
  EXPECT_EQ(RunAgent(Options(1, {})), 128 + SIGTERM);
  EXPECT_EQ(signals_->Pending(), SIGTERM);  // left unread
  while (signals_->Read() != 0) {
  }
  EXPECT_EQ(signals_->Pending(), 0);
}

TEST_F(FakeAgentTest, AWorkerThatCannotStartIsLaunchsOwnError) {
  fake_.script = [](int, const SpawnOptions&) {
    FakeProcessLauncher::Script s;
    s.spawn_error = absl::PermissionDeniedError("cannot start '/x': Permission denied");
    return s;
  };
  EXPECT_EQ(RunAgent(Options(2, {})), 1);
  EXPECT_TRUE(coord_.reported().empty());
}

TEST_F(FakeAgentTest, ADryRunStartsNothing) {
  AgentOptions o = Options(2, {});
  o.dry_run = true;
  EXPECT_EQ(RunAgent(o), 0);
  EXPECT_TRUE(fake_.spawned().empty());
}

}  // namespace
}  // namespace launch
