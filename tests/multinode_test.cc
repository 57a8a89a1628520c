// Multi-node integration tests on loopback: several `launch` agents (separate processes), with a
// standalone `launch coordinator` or one hosted by an agent. Every process is waited for.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "httplib.h"
#include "gtest/gtest.h"
#include "tests/chaos.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kLaunch = LAUNCH_BIN;
const std::string kWorker = TEST_WORKER_BIN;

std::vector<std::string> Agent(const std::string& endpoint, std::vector<std::string> launch_args,
                               std::vector<std::string> worker_args) {
  std::vector<std::string> argv = {kLaunch, "--rdzv-endpoint", endpoint, "--rdzv-id", "job"};
  argv.insert(argv.end(), launch_args.begin(), launch_args.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

std::vector<std::string> Lines(const std::string& s) { return absl::StrSplit(s, '\n', absl::SkipEmpty()); }

// "KEY=VALUE" lines of --print-env output, grouped by the worker's RANK line.
std::vector<std::map<std::string, std::string>> Envs(const std::string& out) {
  std::map<std::string, std::map<std::string, std::string>> by_prefix;
  for (const auto& l : Lines(out)) {
    auto colon = l.find("]:");
    auto eq = l.find('=');
    if (colon == std::string::npos || eq == std::string::npos) continue;
    by_prefix[l.substr(0, colon)][l.substr(colon + 2, eq - colon - 2)] = l.substr(eq + 1);
  }
  std::vector<std::map<std::string, std::string>> out_envs;
  for (auto& [k, v] : by_prefix) out_envs.push_back(v);
  return out_envs;
}

// A standalone coordinator on `host` (port 0, or `port`), killed by the destructor. `prefix` runs
// it elsewhere (`ip netns exec NS`).
class Coordinator {
 public:
  explicit Coordinator(std::vector<std::string> extra = {}, int port = 0, std::vector<std::string> env = {},
                       std::vector<std::string> prefix = {}, std::string host = "127.0.0.1")
      : host_(std::move(host)) {
    std::vector<std::string> argv = prefix;
    // The ThreadSanitizer run keeps the standalone coordinator out of TSan (scripts/test_sanitizers.sh).
    const char* own = std::getenv("LAUNCH_TEST_COORDINATOR_BIN");
    const std::string bin = own && *own ? own : kLaunch;
    for (std::string a : {bin, std::string("coordinator"), std::string("--listen"), absl::StrCat(host_, ":", port)})
      argv.push_back(a);
    argv.insert(argv.end(), extra.begin(), extra.end());
    child_ = std::make_unique<Child>(argv, env);
    ready_ = WaitUntil([&] {
      child_->Pump(5);
      return absl::StrContains(child_->out(), "listening on");
    });
    const std::string at = host_ + ":";
    auto pos = child_->out().find(at);
    if (ready_ && pos != std::string::npos) {
      pos += at.size();
      absl::SimpleAtoi(child_->out().substr(pos, child_->out().find_first_not_of("0123456789", pos) - pos), &port_);
    }
  }
  ~Coordinator() {
    if (child_ && ProcessAlive(child_->pid())) Kill(SIGTERM);
  }
  bool ready() const { return ready_; }
  std::string endpoint() const { return absl::StrCat(host_, ":", port_); }
  int port() const { return port_; }
  RunResult Kill(int sig) {
    ::kill(child_->pid(), sig);
    return child_->Wait(std::chrono::seconds(20));
  }
  Child& child() { return *child_; }

 private:
  std::string host_;
  std::unique_ptr<Child> child_;
  bool ready_ = false;
  int port_ = 0;
};

int FreePort() {
  auto p = PickFreePort("127.0.0.1");
  return p.ok() ? *p : 0;
}

std::vector<RunResult> WaitAll(std::vector<std::unique_ptr<Child>>& agents,
                               std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  std::vector<RunResult> out;
  for (auto& a : agents) out.push_back(a->Wait(timeout));
  return out;
}

const char* kEnvKeys =
    "RANK,LOCAL_RANK,WORLD_SIZE,LOCAL_WORLD_SIZE,GROUP_RANK,GROUP_WORLD_SIZE,MASTER_ADDR,MASTER_PORT,"
    "TORCHELASTIC_RESTART_COUNT,TORCHELASTIC_RUN_ID";

void ExpectOneJob(const std::vector<RunResult>& results, int world, int nodes) {
  std::set<int> ranks;
  std::set<std::string> masters;
  int workers = 0;
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    for (const auto& env : Envs(r.out)) {
      ++workers;
      int rank = -1;
      ASSERT_TRUE(absl::SimpleAtoi(env.at("RANK"), &rank)) << r.out;
      EXPECT_TRUE(ranks.insert(rank).second) << "rank " << rank << " twice";
      EXPECT_EQ(env.at("WORLD_SIZE"), std::to_string(world));
      EXPECT_EQ(env.at("GROUP_WORLD_SIZE"), std::to_string(nodes));
      EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), "job");
      // Global rank = this node's offset (sum of earlier nodes) + local rank.
      masters.insert(env.at("MASTER_ADDR") + ":" + env.at("MASTER_PORT"));
    }
  }
  EXPECT_EQ(workers, world);
  EXPECT_EQ(ranks.size(), static_cast<size_t>(world));
  if (!ranks.empty()) {
    EXPECT_EQ(*ranks.begin(), 0);
    EXPECT_EQ(*ranks.rbegin(), world - 1);
  }
  EXPECT_EQ(masters.size(), 1u) << "every worker must see the same MASTER_ADDR:MASTER_PORT";
}

TEST(MultiNode, TwoAgentsAndAStandaloneCoordinator) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  std::vector<std::unique_ptr<Child>> agents;
  agents.push_back(std::make_unique<Child>(
      Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=2"}, {"--print-env", kEnvKeys})));
  agents.push_back(std::make_unique<Child>(
      Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1"}, {"--print-env", kEnvKeys})));
  ExpectOneJob(WaitAll(agents), 3, 2);
}

TEST(MultiNode, ThreeAgentsWithDifferentLocalSizesOneHostsTheCoordinator) {
  const std::string endpoint = absl::StrCat("127.0.0.1:", FreePort());
  std::vector<std::unique_ptr<Child>> agents;
  for (int n : {1, 3, 2}) {
    agents.push_back(std::make_unique<Child>(
        Agent(endpoint, {"--nnodes=3", absl::StrCat("--nproc-per-node=", n)}, {"--print-env", kEnvKeys})));
  }
  auto results = WaitAll(agents);
  ExpectOneJob(results, 6, 3);
  int hosts = 0;
  for (const auto& r : results) hosts += absl::StrContains(r.err, "hosting the rendezvous coordinator");
  EXPECT_EQ(hosts, 1);
  // Ranks on each node are contiguous: its offset plus its local rank.
  for (const auto& r : results) {
    std::set<int> mine;
    for (const auto& env : Envs(r.out)) mine.insert(std::stoi(env.at("RANK")) - std::stoi(env.at("LOCAL_RANK")));
    EXPECT_EQ(mine.size(), 1u) << r.out;
  }
}

TEST(MultiNode, WorkerFailureStopsEveryNodeAndTheBudgetIsTheJobs) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready());
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  // Rank 0 (node A) would run for ever in the first attempt; rank 1 (node B) fails in it.
  for (int i = 0; i < 2; ++i) {
    agents.push_back(
        std::make_unique<Child>(Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=2"},
                                      {"--stamp", dir / "starts", "--pid-file", dir / "pids{restart}", "--wait-lines",
                                       dir / "pids{restart}", "2", "--fail-rank", "1", "5", "--sleep-below-restart",
                                       "1", "0", "--print-env", "TORCHELASTIC_RESTART_COUNT"})));
  }
  // The failing rank fails in every attempt, so the run ends after 2 restarts with its code.
  auto results = WaitAll(agents);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 5) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("internal")));
  }
  // Three attempts on each node, counted once for the job: restart counts 0, 1, 2 everywhere.
  std::map<std::string, int> by_attempt;
  for (const auto& l : Lines(ReadFile(dir / "starts"))) {
    std::vector<std::string> f = absl::StrSplit(l, ' ');
    ++by_attempt[f[0] + "/" + f[1]];
  }
  for (const char* k : {"0/0", "1/0", "0/1", "1/1", "0/2", "1/2"}) EXPECT_EQ(by_attempt[k], 1) << k;
  EXPECT_EQ(by_attempt.size(), 6u);
  // The node whose worker did not fail says where the job failed first.
  int told = 0;
  for (const auto& r : results) told += absl::StrContains(r.err, "job failed: first failure: rank 1");
  EXPECT_EQ(told, 1);
}

TEST(MultiNode, RestartAfterAFailureElsewhereRunsToSuccess) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready());
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Child>(
        Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=1"},
              {"--pid-file", dir / "pids{restart}", "--wait-lines", dir / "pids{restart}", "2", "--stamp",
               dir / "starts", "--sleep-below-restart", "1", "0.2", "--fail-below-restart", "1", "3"})));
  }
  for (const auto& r : WaitAll(agents)) EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Lines(ReadFile(dir / "starts")).size(), 4u);
}

TEST(MultiNode, LostAgentIsDetectedAndTheSurvivorGoesOn) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready());
  TempDir dir;
  const std::vector<std::string> flags = {"--nnodes=1:2", "--nproc-per-node=1", "--rdzv-conf",
                                          "last_call_timeout=1,heartbeat_timeout=1,heartbeat_interval=0.2"};
  // Both wait until both workers run; then the agent of the second is killed with its worker.
  Child survivor(Agent(coord.endpoint(), flags,
                       {"--pid-file", dir / "pids", "--wait-lines", dir / "pids", "2", "--stamp", dir / "starts",
                        "--print-env", "WORLD_SIZE", "--sleep-if-env", "WORLD_SIZE", "2", "0"}));
  Child victim(Agent(coord.endpoint(), flags, {"--pid-file", dir / "pids", "--sleep", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    survivor.Pump(1);
    victim.Pump(1);
    return ReadPids(dir / "pids").size() == 2;
  }));
  std::vector<pid_t> workers = ReadPids(dir / "pids");
  ::kill(victim.pid(), SIGKILL);
  EXPECT_EQ(victim.Wait().exit_code, 128 + SIGKILL);
  // The survivor's worker of the two-node round never ends by itself; the round after the loss
  // has world size 1 and runs to the end. A membership change spends no restart budget.
  auto r = survivor.Wait(std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("lost node"));
  EXPECT_THAT(r.out, HasSubstr("WORLD_SIZE=1"));
  for (pid_t p : workers) EXPECT_FALSE(ProcessAlive(p)) << "worker " << p << " survived";
}

// SIGSTOP/SIGCONT of the coordinator (or a paused VM) expired healthy nodes' leases: the time
// it did not run no longer counts against them. Stopped for 3 s with heartbeat_timeout=1, it
// says so when it runs again, and the job ends in its first round.
TEST(MultiNode, AStoppedCoordinatorDoesNotLoseHealthyNodes) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready());
  TempDir dir;
  const std::vector<std::string> flags = {"--nnodes=2", "--nproc-per-node=1", "--rdzv-conf",
                                          "heartbeat_timeout=1,heartbeat_interval=0.2"};
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Child>(
        Agent(coord.endpoint(), flags, {"--pid-file", dir / "pids", "--wait-lines", dir / "go", "1", "--exit", "0"})));
  }
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& a : agents) a->Pump(1);
    return ReadPids(dir / "pids").size() == 2;
  }));
  ::kill(coord.child().pid(), SIGSTOP);
  // The pause is the stimulus: three heartbeat timeouts without the coordinator running.
  for (int i = 0; i < 300; ++i) {
    for (auto& a : agents) a->Pump(10);
  }
  ::kill(coord.child().pid(), SIGCONT);
  EXPECT_TRUE(WaitUntil([&] {
    coord.child().Pump(5);
    for (auto& a : agents) a->Pump(1);
    return absl::StrContains(coord.child().err(), "did not run for");
  })) << coord.child().err();
  WriteFile(dir / "go", "go\n");
  for (auto& r : WaitAll(agents)) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("lost node")));
    EXPECT_THAT(r.err, Not(HasSubstr("new round")));
  }
  EXPECT_THAT(coord.child().err(), Not(HasSubstr("lost node")));
}

// gRPC 1.51 never polls a listening socket again once accept() fails with EMFILE: 400 plain TCP
// connects to a coordinator limited to 200 descriptors left it deaf for good (joins timed out
// after the connections had closed). Its listener is now rebuilt on the same port, and a job
// that was running goes on through the flood without a restart.
TEST(MultiNode, AConnectionFloodDoesNotDeafenTheCoordinator) {
  Coordinator coord({}, 0, {}, {"/usr/bin/prlimit", "--nofile=200:200"});
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Child>(Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1"},
                                                   {"--pid-file", dir / "pids", "--wait-lines", dir / "go", "1"})));
  }
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& a : agents) a->Pump(1);
    return ReadPids(dir / "pids").size() == 2;
  }));
  std::vector<UniqueFd> flood;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(coord.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < 400; ++i) {
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(s.valid());
    ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);  // EINPROGRESS is fine
    flood.push_back(std::move(s));
  }
  EXPECT_TRUE(WaitUntil([&] {
    coord.child().Pump(5);
    for (auto& a : agents) a->Pump(1);
    return absl::StrContains(coord.child().err(), "stopped accepting connections");
  })) << coord.child().err();
  flood.clear();
  EXPECT_TRUE(WaitUntil([&] {
    coord.child().Pump(5);
    for (auto& a : agents) a->Pump(1);
    return absl::StrContains(coord.child().err(), "accepts connections again");
  })) << coord.child().err();
  WriteFile(dir / "go", "go\n");
  for (auto& r : WaitAll(agents)) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("new round")));
  }
  // A new job joins the rebuilt listener.
  std::vector<std::unique_ptr<Child>> next;
  next.push_back(
      std::make_unique<Child>(std::vector<std::string>{kLaunch, "--rdzv-endpoint", coord.endpoint(), "--rdzv-id",
                                                       "next", "--nnodes=1", kWorker, "--exit", "0"}));
  for (auto& r : WaitAll(next)) EXPECT_EQ(r.exit_code, 0) << r.err;
}

#ifdef TRAIN_MLP_BIN
// A rank that hangs on one node: that node names it with its stack, the other node is asked for
// its workers' stacks before they stop (rank 0 waits in the allreduce), and the job resumes.
// The run ends two steps after its last checkpoint: rank 0 writing one after the last step took
// over the 3 s hang timeout under AddressSanitizer on a loaded machine, and rank 1, waiting in the
// final barrier, was rightly found hung.
TEST(MultiNode, AHangOnOneNodeCapturesTheStacksOnEveryNode) {
  if (::access("/usr/bin/gdb", X_OK) != 0) GTEST_SKIP() << "no gdb (scripts/install_deps.sh installs it)";
  Coordinator coord;
  ASSERT_TRUE(coord.ready());
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Child>(std::vector<std::string>{kLaunch,
                                                                      "--rdzv-endpoint",
                                                                      coord.endpoint(),
                                                                      "--rdzv-id",
                                                                      "hang",
                                                                      "--nnodes=2",
                                                                      "--nproc-per-node=1",
                                                                      "--max-restarts=1",
                                                                      "--hang-timeout",
                                                                      "3",
                                                                      "--log-dir",
                                                                      dir / ("node" + std::to_string(i)),
                                                                      TRAIN_MLP_BIN,
                                                                      "--dims",
                                                                      "16,32,4",
                                                                      "--steps",
                                                                      "22",
                                                                      "--warmup",
                                                                      "0",
                                                                      "--dataset-size",
                                                                      "256",
                                                                      "--checkpoint-dir",
                                                                      dir / "ckpt",
                                                                      "--checkpoint-every",
                                                                      "5",
                                                                      "--print-every",
                                                                      "0",
                                                                      "--hang-at-step",
                                                                      "12"}));
  }
  auto results = WaitAll(agents, std::chrono::seconds(120));
  int hung_lines = 0;
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    hung_lines += absl::StrContains(r.err, "rank 1 failed (hung: no step for");
  }
  EXPECT_EQ(hung_lines, 1);
  // Every node kept its worker's stacks of the hung attempt; rank 1's shows where it sleeps.
  std::string stacks;
  for (int i = 0; i < 2; ++i) {
    const std::string file = dir / ("node" + std::to_string(i) + "/hang/attempt_0/0/stacks.txt");
    const std::string text = ReadFile(file);
    EXPECT_THAT(text, HasSubstr("Thread 1 ")) << file;
    stacks += text;
  }
  EXPECT_THAT(stacks, HasSubstr("HangForever"));
}
// The live view of a running 2-node job: `launch status` shows both nodes and every rank's step
// and figures, and the coordinator's Prometheus endpoint serves their step rates to a scraper
// with the token (and to nobody else).
TEST(MultiNode, StatusAndTheMetricsEndpointShowARunningTwoNodeJob) {
  const int metrics_port = FreePort();
  const std::vector<std::string> env = {"LAUNCH_RDZV_TOKEN=a-token-for-the-job"};
  Coordinator coord({"--metrics-port", std::to_string(metrics_port)}, 0, env);
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Child>(std::vector<std::string>{kLaunch,
                                                                      "--rdzv-endpoint",
                                                                      coord.endpoint(),
                                                                      "--rdzv-id",
                                                                      "live",
                                                                      "--nnodes=2",
                                                                      "--nproc-per-node=1",
                                                                      "--monitor-interval",
                                                                      "1",
                                                                      TRAIN_MLP_BIN,
                                                                      "--dims",
                                                                      "16,32,4",
                                                                      "--steps",
                                                                      "100000",
                                                                      "--warmup",
                                                                      "0",
                                                                      "--print-every",
                                                                      "0",
                                                                      "--slow-rank",
                                                                      "0",
                                                                      "--slow-ms",
                                                                      "20"},
                                             env));
  }
  const std::vector<std::string> status = {kLaunch, "status", "--rdzv-endpoint", coord.endpoint(), "--rdzv-id", "live"};
  RunResult shown;
  const bool both = WaitUntil(
      [&] {
        for (auto& a : agents) a->Pump(100);
        shown = RunCmd(status, env);
        return std::regex_search(shown.out, std::regex("\n0 +[^ ]+ +running +[1-9][0-9]* ")) &&
               std::regex_search(shown.out, std::regex("\n1 +[^ ]+ +running +[1-9][0-9]* "));
      },
      std::chrono::seconds(60));
  EXPECT_TRUE(both) << shown.out << shown.err;
  EXPECT_THAT(shown.out, HasSubstr("run live  round 1  running  restarts 0/0"));
  EXPECT_EQ(Lines(shown.out).size(), 7u) << shown.out;  // the job; nodes (header, 2); ranks (header, 2)
  EXPECT_EQ(RunCmd(status).exit_code, 1);               // no token: refused, one line
  auto json = RunCmd({kLaunch, "status", "--rdzv-endpoint", coord.endpoint(), "--rdzv-id", "live", "--json"}, env);
  EXPECT_THAT(json.out, HasSubstr("\"run_id\":\"live\""));

  httplib::Client scraper("127.0.0.1", metrics_port);
  auto denied = scraper.Get("/metrics");
  ASSERT_TRUE(denied) << "no answer from the metrics port";
  EXPECT_EQ(denied->status, 401);
  auto page = scraper.Get("/metrics", {{"Authorization", "Bearer a-token-for-the-job"}});
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  for (int rank : {0, 1}) {
    EXPECT_TRUE(
        std::regex_search(page->body, std::regex(absl::StrCat("\nlaunch_rank_steps_per_second\\{run=\"live\",rank=\"",
                                                              rank, "\",node=\"[^\"]+\"\\} [0-9.e+]+\n"))))
        << page->body;
  }
  EXPECT_THAT(page->body, HasSubstr("launch_run_info{run=\"live\",state=\"running\"} 1\n"));
  EXPECT_THAT(page->body, HasSubstr("launch_run_nodes{run=\"live\"} 2\n"));
  for (auto& a : agents) ::kill(a->pid(), SIGTERM);
  for (auto& r : WaitAll(agents)) EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
}

#endif

TEST(MultiNode, CoordinatorKilledAndRestartedMidJobTheJobCompletesWithoutARestart) {
  const int port = FreePort();
  auto coord = std::make_unique<Coordinator>(std::vector<std::string>{}, port);
  ASSERT_TRUE(coord->ready());
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(
        std::make_unique<Child>(Agent(coord->endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=3"},
                                      {"--pid-file", dir / "pids", "--wait-lines", dir / "go", "1", "--print-env",
                                       "TORCHELASTIC_RESTART_COUNT"})));
  }
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& a : agents) a->Pump(1);
    return ReadPids(dir / "pids").size() == 2;
  }));
  coord->Kill(SIGKILL);
  coord.reset();
  Coordinator again({}, port);
  ASSERT_TRUE(again.ready()) << again.child().err();
  // The agents re-register; then the workers finish.
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& a : agents) a->Pump(1);
    again.child().Pump(1);
    const std::string& err = again.child().err();
    int n = 0;
    for (size_t pos = err.find("re-registered"); pos != std::string::npos; pos = err.find("re-registered", pos + 1))
      ++n;
    return n == 2;
  }));
  WriteFile(dir / "go", "go\n");
  for (const auto& r : WaitAll(agents)) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("TORCHELASTIC_RESTART_COUNT=0"));
    EXPECT_THAT(r.out, Not(HasSubstr("TORCHELASTIC_RESTART_COUNT=1")));
  }
}

TEST(MultiNode, AgentHostedCoordinatorLostWithItsNodeFailsTheJobCleanly) {
  const std::string endpoint = absl::StrCat("127.0.0.1:", FreePort());
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Child>(Agent(endpoint,
                                                   {"--nnodes=2", "--nproc-per-node=1", "--rdzv-conf",
                                                    "close_timeout=2,heartbeat_timeout=1,heartbeat_interval=0.2"},
                                                   {"--pid-file", dir / "pids", "--sleep", "0"})));
  }
  int host = -1;
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& a : agents) a->Pump(1);
    for (int i = 0; i < 2; ++i)
      if (absl::StrContains(agents[i]->err(), "hosting the rendezvous coordinator")) host = i;
    return host >= 0 && ReadPids(dir / "pids").size() == 2;
  }));
  const std::vector<pid_t> workers = ReadPids(dir / "pids");
  ::kill(agents[host]->pid(), SIGKILL);
  EXPECT_EQ(agents[host]->Wait().exit_code, 128 + SIGKILL);
  // The other node's workers would run for ever: its agent gives up on the coordinator after
  // close_timeout, stops them, and says why.
  RunResult r = agents[1 - host]->Wait(std::chrono::seconds(30));
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("job failed: the coordinator at " + endpoint + ", hosted by the agent of"));
  EXPECT_THAT(r.err, HasSubstr("the job cannot go on without it"));
  for (pid_t p : workers) EXPECT_FALSE(ProcessAlive(p)) << "worker " << p << " survived";
}

// Two agents on loopback, one hosting the coordinator, each with one worker that sleeps; the
// close_timeout is 30 s, as by default.
struct HostedPair {
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  int host = -1;
  std::vector<pid_t> workers;
  explicit HostedPair(const std::string& endpoint) {
    for (int i = 0; i < 2; ++i) {
      agents.push_back(std::make_unique<Child>(
          Agent(endpoint, {"--nnodes=2", "--nproc-per-node=1"}, {"--pid-file", dir / "pids", "--sleep", "0"})));
    }
  }
  bool Running() {
    const bool up = WaitUntil([&] {
      for (auto& a : agents) a->Pump(1);
      for (int i = 0; i < 2; ++i)
        if (absl::StrContains(agents[i]->err(), "hosting the rendezvous coordinator")) host = i;
      return host >= 0 && ReadPids(dir / "pids").size() == 2;
    });
    workers = ReadPids(dir / "pids");
    return up;
  }
};

// scancel (or a pod's deletion) sends SIGTERM to every node's launch at once. The hosting node
// used to wait its whole close_timeout for nodes that had left, and Slurm SIGKILLed it at KillWait.
// Now every node is gone within the workers' grace. `host_first`: the host is signalled first.
void StopEveryNodeAtOnce(bool host_first) {
  HostedPair pair(absl::StrCat("127.0.0.1:", FreePort()));
  ASSERT_TRUE(pair.Running());
  const auto start = std::chrono::steady_clock::now();
  ::kill(pair.agents[host_first ? pair.host : 1 - pair.host]->pid(), SIGTERM);
  ::kill(pair.agents[host_first ? 1 - pair.host : pair.host]->pid(), SIGTERM);
  std::vector<RunResult> results = WaitAll(pair.agents, std::chrono::seconds(40));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << "host " << pair.host << ":\n"
                                                                                << results[0].err << "---\n"
                                                                                << results[1].err;
  for (const auto& r : results) {
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("leaving before every node learned")));
  }
  for (pid_t p : pair.workers) EXPECT_FALSE(ProcessAlive(p)) << "worker " << p << " survived";
}

TEST(MultiNode, EveryNodeStoppedAtOnceLeavesAtOnce) { StopEveryNodeAtOnce(false); }
TEST(MultiNode, EveryNodeStoppedAtOnceHostFirstLeavesAtOnce) { StopEveryNodeAtOnce(true); }

// The host stopped alone: the other node learns at once that the job cannot go on, instead of
// finding the coordinator unreachable for close_timeout.
TEST(MultiNode, TheHostStoppedAloneEndsTheJobOnTheOtherNodeAtOnce) {
  HostedPair pair(absl::StrCat("127.0.0.1:", FreePort()));
  ASSERT_TRUE(pair.Running());
  const auto start = std::chrono::steady_clock::now();
  ::kill(pair.agents[pair.host]->pid(), SIGTERM);
  RunResult hosting = pair.agents[pair.host]->Wait(std::chrono::seconds(40));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  RunResult other = pair.agents[1 - pair.host]->Wait(std::chrono::seconds(60));
  EXPECT_EQ(hosting.exit_code, 128 + SIGTERM) << hosting.err;
  EXPECT_NE(other.exit_code, 0) << other.err;
  // The other node hears of the end on its stream at once and stops its workers. Its exit report
  // for the verdict races the host's exit: when it loses (seen under ASan) it gives up on the
  // coordinator after close_timeout instead.
  EXPECT_THAT(other.err, ::testing::AnyOf(HasSubstr("which hosts the coordinator, was stopped"),
                                          HasSubstr("gave up on the coordinator")));
  for (pid_t p : pair.workers) EXPECT_FALSE(ProcessAlive(p)) << "worker " << p << " survived";
}

TEST(MultiNode, JoinBeyondMaxWaitsAsASpareAndMismatchedSettingsAreRejected) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready());
  TempDir dir;
  Child a(Agent(coord.endpoint(), {"--nnodes=1", "--nproc-per-node=1"}, {"--pid-file", dir / "pids", "--sleep", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    a.Pump(1);
    return ReadPids(dir / "pids").size() == 1;
  }));
  // A node beyond --nnodes max waits as a spare for a place, up to its join timeout.
  auto extra = RunCmd(
      Agent(coord.endpoint(), {"--nnodes=1", "--nproc-per-node=1", "--rdzv-conf", "join_timeout=1"}, {}));
  EXPECT_EQ(extra.exit_code, 1);
  EXPECT_THAT(extra.err,
              HasSubstr(
                  "kept its 1 node(s) (--nnodes max) for all of join_timeout 1 s while this node waited as a spare"));
  auto mismatch = RunCmd(Agent(coord.endpoint(), {"--nnodes=1:2", "--nproc-per-node=1"}, {}));
  EXPECT_EQ(mismatch.exit_code, 1);
  EXPECT_THAT(mismatch.err, HasSubstr("this node asks for --nnodes 1:2"));
  coord.child().Pump(50);
  EXPECT_THAT(coord.child().err(), HasSubstr("rejected join"));
  EXPECT_THAT(coord.child().err(), HasSubstr("ipv4:127.0.0.1:"));
  EXPECT_THAT(coord.child().err(), HasSubstr("waits as a spare"));
  EXPECT_THAT(coord.child().err(), HasSubstr("gave up on spare node"));
  ::kill(a.pid(), SIGTERM);
  EXPECT_EQ(a.Wait().exit_code, 143);
}

TEST(MultiNode, LoopbackNodeAddressInAClusterIsAClearError) {
  auto r = RunCmd({kLaunch, "--nnodes=2", "--rdzv-endpoint=10.255.255.1:29400", "--local-addr=127.0.0.1", kWorker});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("resolves to loopback 127.0.0.1"));
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  r = RunCmd({kLaunch, "--nnodes=2", kWorker});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("needs --rdzv-endpoint"));
}

TEST(MultiNode, StaticBackendGivesRanksFromNodeRank) {
  const std::string port = std::to_string(FreePort());
  auto r = RunCmd({kLaunch, "--rdzv-backend=static", "--nnodes=2", "--node-rank=1", "--nproc-per-node=2",
                   "--master-addr=127.0.0.1", "--master-port=" + port, "--dry-run", kWorker});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("RANK=2"));
  EXPECT_THAT(r.out, HasSubstr("RANK=3"));
  EXPECT_THAT(r.out, HasSubstr("WORLD_SIZE=4"));
  EXPECT_THAT(r.out, HasSubstr("GROUP_RANK=1"));
  EXPECT_THAT(r.out, HasSubstr("MASTER_PORT=" + port));
}

// ---- security ----

std::vector<RunResult> RunTwoAgents(const std::string& endpoint, const std::vector<std::string>& flags,
                                    const std::vector<std::string>& env = {}) {
  std::vector<std::string> f = {"--nnodes=2", "--nproc-per-node=1"};
  f.insert(f.end(), flags.begin(), flags.end());
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i)
    agents.push_back(std::make_unique<Child>(Agent(endpoint, f, {"--print-env", kEnvKeys}), env));
  return WaitAll(agents);
}

// (Every RPC needing the token is CoordinatorRpc.EveryRpcNeedsTheToken.)
TEST(MultiNodeSecurity, AJoinNeedsTheRightTokenFromTheFileOrTheEnvironment) {
  TempDir dir;
  WriteFile(dir / "token", "s3cret-token-for-test\n");
  WriteFile(dir / "wrong", "not-the-right-token\n");
  Coordinator coord({"--rdzv-token-file", dir / "token"});
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  EXPECT_THAT(coord.child().out(), HasSubstr("token required"));

  auto none = RunCmd(Agent(coord.endpoint(), {"--nnodes=2"}, {}));
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_THAT(none.err, HasSubstr("needs a rendezvous token"));
  auto wrong = RunCmd(Agent(coord.endpoint(), {"--nnodes=2", "--rdzv-token-file", dir / "wrong"}, {}));
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_THAT(wrong.err, HasSubstr("wrong rendezvous token"));
  coord.child().Pump(50);
  EXPECT_THAT(coord.child().err(), HasSubstr("rejected Join from ipv4:127.0.0.1:"));
  EXPECT_THAT(coord.child().err(), HasSubstr("wrong rendezvous token"));

  // The right token from the file on one node and from LAUNCH_RDZV_TOKEN on the other.
  std::vector<std::unique_ptr<Child>> agents;
  agents.push_back(std::make_unique<Child>(
      Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--rdzv-token-file", dir / "token"},
            {"--print-env", kEnvKeys})));
  agents.push_back(
      std::make_unique<Child>(Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1"}, {"--print-env", kEnvKeys}),
                              std::vector<std::string>{"LAUNCH_RDZV_TOKEN=s3cret-token-for-test"}));
  ExpectOneJob(WaitAll(agents), 2, 2);
}

TEST(MultiNodeSecurity, ReachableListenerNeedsTokenOrTlsUnlessInsecure) {
  auto r = RunCmd({kLaunch, "coordinator", "--listen", "0.0.0.0:0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("refusing to serve the rendezvous on 0.0.0.0 without protection"));
  EXPECT_EQ(Lines(r.err).size(), 1u) << r.err;
  Child open({kLaunch, "coordinator", "--listen", "0.0.0.0:0", "--insecure"});
  EXPECT_TRUE(WaitUntil([&] {
    open.Pump(5);
    return absl::StrContains(open.out(), "listening on");
  }));
  ::kill(open.pid(), SIGTERM);
  EXPECT_EQ(open.Wait().exit_code, 143);
  auto bad = RunCmd({kLaunch, "coordinator", "--listen", "127.0.0.1"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("expected HOST:PORT"));
}

// `launch coordinator --listen 127.0.0.1:P` without a token served every local user: another one
// could list its nodes and forge a ReportExit that failed the job. It is its user's only now: it
// takes a random token and publishes it in a file only that user can read, where that user's
// clients of a loopback endpoint find it (no flag); another user is refused and cannot read it.
TEST(MultiNodeSecurity, ALoopbackCoordinatorWithoutATokenServesItsUserOnly) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  const std::string out = coord.child().out();
  const std::string marker = "this user's only: token in ";
  auto at = out.find(marker);
  ASSERT_NE(at, std::string::npos) << out;
  const std::string file = out.substr(at + marker.size(), out.find(')', at) - at - marker.size());
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0) << file;
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(std::filesystem::path(file).parent_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // Its user: no flag needed.
  auto mine = RunCmd({kLaunch, "status", "--rdzv-endpoint", coord.endpoint(), "--rdzv-id", "nosuch"});
  EXPECT_THAT(mine.err, HasSubstr("no run 'nosuch'"));
  ExpectOneJob(RunTwoAgents(coord.endpoint(), {}), 2, 2);
  // Another local user (nobody, uid 65534).
  if (::geteuid() != 0) GTEST_SKIP() << "running a command as another user needs root";
  const std::vector<std::string> as_nobody = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  auto probe = RunCmd({as_nobody[0], as_nobody[1], as_nobody[2], as_nobody[3], kLaunch, "--version"});
  if (probe.exit_code != 0) GTEST_SKIP() << "uid 65534 cannot run " << kLaunch << ": " << probe.err;
  std::vector<std::string> status = as_nobody;
  for (std::string a : {std::string(kLaunch), std::string("status"), std::string("--rdzv-endpoint"), coord.endpoint(),
                        std::string("--rdzv-id"), std::string("none")})
    status.push_back(a);
  auto other = RunCmd(status);
  EXPECT_EQ(other.exit_code, 1) << other.err;
  EXPECT_THAT(other.err, HasSubstr("serves only the user who started it"));
  std::vector<std::string> read = as_nobody;
  read.push_back("/bin/cat");
  read.push_back(file);
  EXPECT_NE(RunCmd(read).exit_code, 0);
  // Gone with its coordinator.
  coord.Kill(SIGTERM);
  coord.child().Wait();
  EXPECT_NE(::stat(file.c_str(), &st), 0) << file;
}

TEST(MultiNodeSecurity, TlsAndMutualTls) {
  TempDir dir;
  TestCerts certs(dir);
  ASSERT_TRUE(certs.ok) << certs.error;
  {
    Coordinator tls({"--tls-cert", certs.server_cert, "--tls-key", certs.server_key});
    ASSERT_TRUE(tls.ready()) << tls.child().err();
    EXPECT_THAT(tls.child().out(), HasSubstr("(TLS)"));
    ExpectOneJob(RunTwoAgents(tls.endpoint(), {"--tls-ca", certs.ca}), 2, 2);
  }
  Coordinator mtls({"--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-ca", certs.ca});
  ASSERT_TRUE(mtls.ready()) << mtls.child().err();
  // Without a client certificate the handshake fails: the agent gives up at its join timeout.
  auto anon = RunCmd(Agent(mtls.endpoint(), {"--nnodes=2", "--tls-ca", certs.ca, "--rdzv-conf", "join_timeout=1"}, {}));
  EXPECT_EQ(anon.exit_code, 1) << anon.err;
  EXPECT_THAT(anon.err, HasSubstr("no answer within the join timeout"));
  ExpectOneJob(RunTwoAgents(mtls.endpoint(),
                            {"--tls-ca", certs.ca, "--tls-cert", certs.client_cert, "--tls-key", certs.client_key}),
               2, 2);
  auto bad = RunCmd(Agent(mtls.endpoint(), {"--nnodes=2", "--tls-ca", dir / "server.ext"}, {}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("expected a PEM file"));
}

// ---- network namespaces ----

// A small network made for one test: a hub namespace holding a bridge (and the coordinator on
// 10.213.7.1), and one namespace per node, joined to the bridge by a veth pair, with its own
// address 10.213.7.(10+i). Traffic stays inside these namespaces. The destructor deletes them all.
class NetnsLab {
 public:
  explicit NetnsLab(int nodes) : tag_(absl::StrCat("lt", ::getpid())) {
    if (::geteuid() != 0) {
      why_ = "needs root";
      return;
    }
    const std::string hub = Hub();
    if (!Ip({"netns", "add", hub})) return;
    made_.push_back(hub);
    if (!Ip({"-n", hub, "link", "set", "lo", "up"}) || !Ip({"-n", hub, "link", "add", "br0", "type", "bridge"}) ||
        !Ip({"-n", hub, "addr", "add", absl::StrCat(HubAddress(), "/24"), "dev", "br0"}) ||
        !Ip({"-n", hub, "link", "set", "br0", "up"})) {
      return;
    }
    for (int i = 0; i < nodes; ++i) {
      const std::string ns = Node(i);
      if (!Ip({"netns", "add", ns})) return;
      made_.push_back(ns);
      if (!Ip({"-n", ns, "link", "set", "lo", "up"}) ||
          !Ip({"-n", hub, "link", "add", Port(i), "type", "veth", "peer", "name", "eth0", "netns", ns}) ||
          !Ip({"-n", hub, "link", "set", Port(i), "master", "br0"}) || !Ip({"-n", hub, "link", "set", Port(i), "up"}) ||
          !Ip({"-n", ns, "addr", "add", absl::StrCat(NodeAddress(i), "/24"), "dev", "eth0"}) ||
          !Ip({"-n", ns, "link", "set", "eth0", "up"})) {
        return;
      }
    }
    ok_ = true;
  }
  ~NetnsLab() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) RunCmd({"/usr/sbin/ip", "netns", "del", *it});
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::string Hub() const { return tag_ + "h"; }
  std::string Node(int i) const { return absl::StrCat(tag_, "n", i); }
  static std::string HubAddress() { return "10.213.7.1"; }
  static std::string NodeAddress(int i) { return absl::StrCat("10.213.7.", 10 + i); }
  // argv run inside namespace `ns`.
  static std::vector<std::string> In(const std::string& ns, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", ns});
    return argv;
  }
  // The job's token in `dir` and a coordinator on the hub that wants it.
  std::unique_ptr<Coordinator> StartCoordinator(const TempDir& dir) const {
    WriteFile(dir / "token", "netns-test-token\n");
    return std::make_unique<Coordinator>(std::vector<std::string>{"--rdzv-token-file", dir / "token"}, 0,
                                         std::vector<std::string>{}, In(Hub(), {}), HubAddress());
  }
  // An agent in node i's namespace, on its address, with the token: `flags` for launch, `args`
  // for the test worker.
  std::unique_ptr<Child> StartAgent(int i, const Coordinator& coord, const TempDir& dir, std::vector<std::string> flags,
                                    std::vector<std::string> args) const {
    for (std::string f : {std::string("--local-addr"), NodeAddress(i), std::string("--rdzv-token-file"), dir / "token"})
      flags.push_back(f);
    return std::make_unique<Child>(In(Node(i), Agent(coord.endpoint(), std::move(flags), std::move(args))));
  }
  // Unplugs (or plugs back) node i's cable: its port on the hub's bridge goes down (up).
  bool SetLink(int i, bool up) { return Ip({"-n", Hub(), "link", "set", Port(i), up ? "up" : "down"}); }
  // Node i's UDP to `addr` goes nowhere (a firewall that lets only TCP through): policy routing
  // sends UDP to a table whose route to `addr` is via a gateway that does not exist, so sending
  // works and the datagrams are dropped.
  bool BlockUdp(int i, const std::string& addr) {
    return Ip({"-n", Node(i), "rule", "add", "ipproto", "udp", "table", "100"}) &&
           Ip({"-n", Node(i), "route", "add", addr, "via", "10.213.7.250", "table", "100"});
  }

 private:
  std::string Port(int i) const { return absl::StrCat(tag_, "v", i); }
  bool Ip(std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/sbin/ip");
    auto r = RunCmd(args);
    if (r.exit_code != 0 && why_.empty()) why_ = absl::StrCat(absl::StrJoin(args, " "), ": ", r.err);
    return r.exit_code == 0;
  }
  std::string tag_;
  std::vector<std::string> made_;
  bool ok_ = false;
  std::string why_;
};

// Every line "KEY=VALUE" a child printed so far, for one key.
std::vector<std::string> Values(const std::string& out, const std::string& key) {
  std::vector<std::string> v;
  for (const auto& l : Lines(out)) {
    auto pos = l.find("]:" + key + "=");
    if (pos != std::string::npos) v.push_back(l.substr(pos + 3 + key.size()));
  }
  return v;
}

TEST(MultiNodeNetns, CutNodeIsLostTheOthersGoOnAndItRejoinsWhenItsLinkComesBack) {
  NetnsLab lab(3);
  if (!lab.ok()) GTEST_SKIP() << "network namespaces unavailable: " << lab.why();
  TempDir dir;
  auto hub = lab.StartCoordinator(dir);
  Coordinator& coord = *hub;
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  // Workers of rounds 1 (3 nodes) and 2 (the 2 left) run until stopped; round 3 ends the job.
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(
        lab.StartAgent(i, coord, dir,
                       {"--nnodes=2:3", "--nproc-per-node=1", "--rdzv-conf",
                        "last_call_timeout=10,heartbeat_timeout=1,heartbeat_interval=0.2"},
                       {"--pid-file", dir / "pids", "--print-env", "LAUNCH_ROUND,WORLD_SIZE,RANK,MASTER_ADDR",
                        "--sleep-unless-env", "LAUNCH_ROUND", "3", "0"}));
  }
  auto pump = [&] {
    for (auto& a : agents) a->Pump(1);
    coord.child().Pump(1);
  };
  // Every worker runs and its round-1 lines have reached its agent's output.
  ASSERT_TRUE(WaitUntil([&] {
    pump();
    return ReadPids(dir / "pids").size() == 3 && std::all_of(agents.begin(), agents.end(), [](const auto& a) {
             return !Values(a->out(), "MASTER_ADDR").empty();
           });
  })) << coord.child().err();
  const pid_t cut_worker = ReadPids(dir / "pids").back();
  for (auto& a : agents) {
    EXPECT_THAT(Values(a->out(), "WORLD_SIZE"), ::testing::ElementsAre("3")) << a->err();
    // MASTER_ADDR is the group-rank-0 node's own address on the bridge.
    for (const auto& m : Values(a->out(), "MASTER_ADDR")) EXPECT_TRUE(absl::StartsWith(m, "10.213.7.1")) << m;
  }
  // Unplug the node that runs the last worker to start (its agent is the worker's parent).
  int cut = -1;
  for (int i = 0; i < 3 && cut < 0; ++i) {
    if (ParentAndName(cut_worker).first == agents[i]->pid()) cut = i;
  }
  ASSERT_GE(cut, 0) << "no agent is the parent of worker " << cut_worker;
  ASSERT_TRUE(lab.SetLink(cut, false)) << lab.why();
  // The two others are told of the loss and run round 2 with world size 2.
  ASSERT_TRUE(WaitUntil([&] {
    pump();
    for (int i = 0; i < 3; ++i)
      if (i != cut && Values(agents[i]->out(), "WORLD_SIZE").size() < 2) return false;
    return true;
  })) << coord.child().err();
  for (int i = 0; i < 3; ++i) {
    if (i == cut) continue;
    EXPECT_THAT(Values(agents[i]->out(), "WORLD_SIZE"), ::testing::ElementsAre("3", "2"));
    EXPECT_THAT(agents[i]->err(), HasSubstr("lost node"));
  }
  EXPECT_THAT(coord.child().err(), HasSubstr(NetnsLab::NodeAddress(cut)));
  // Cut off, the node notices that the coordinator is unreachable, and keeps its worker running
  // while it retries.
  EXPECT_TRUE(WaitUntil([&] {
    pump();
    return absl::StrContains(agents[cut]->err(), "unreachable");
  })) << agents[cut]->err();
  EXPECT_TRUE(ProcessAlive(cut_worker));
  EXPECT_THAT(Values(agents[cut]->out(), "WORLD_SIZE"), ::testing::ElementsAre("3"));

  ASSERT_TRUE(lab.SetLink(cut, true)) << lab.why();
  // Back on the network, it learns that it was left out, re-joins, and round 3 takes all three.
  auto results = WaitAll(agents, std::chrono::seconds(60));
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(Values(r.out, "LAUNCH_ROUND").back(), "3") << r.out;
    EXPECT_EQ(Values(r.out, "WORLD_SIZE").back(), "3") << r.out;
  }
  std::set<std::string> ranks;
  for (const auto& r : results) ranks.insert(Values(r.out, "RANK").back());
  EXPECT_THAT(ranks, ::testing::ElementsAre("0", "1", "2"));
  for (pid_t p : ReadPids(dir / "pids")) EXPECT_FALSE(ProcessAlive(p)) << "worker " << p << " survived";
}

TEST(MultiNodeNetns, NodeWhoseLeaseDatagramsAreBlockedHeartbeatsOnItsStream) {
  NetnsLab lab(2);
  if (!lab.ok()) GTEST_SKIP() << "network namespaces unavailable: " << lab.why();
  if (!lab.BlockUdp(1, NetnsLab::HubAddress())) GTEST_SKIP() << "policy routing unavailable: " << lab.why();
  TempDir dir;
  auto hub = lab.StartCoordinator(dir);
  Coordinator& coord = *hub;
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(lab.StartAgent(i, coord, dir,
                                    {"--nnodes=2", "--nproc-per-node=1", "--rdzv-conf",
                                     "heartbeat_timeout=1,heartbeat_interval=0.2"},
                                    {"--print-env", "LAUNCH_ROUND", "--wait-lines", dir / "go", "1"}));
  }
  auto pump = [&] {
    for (auto& a : agents) a->Pump(1);
    coord.child().Pump(1);
  };
  // Node 1's datagrams never arrive: by its third stream heartbeat the coordinator says so (its
  // line and the agent's come through two pipes: either may be read first).
  ASSERT_TRUE(WaitUntil([&] {
    pump();
    return absl::StrContains(agents[1]->err(), "do not arrive; heartbeating on the stream") &&
           absl::StrContains(coord.child().err(), "no lease datagram from node");
  })) << agents[1]->err()
      << coord.child().err();
  EXPECT_THAT(coord.child().err(), HasSubstr("no lease datagram from node"));
  EXPECT_THAT(agents[0]->err(), Not(HasSubstr("heartbeating on the stream")));
  // Three lease timeouts later both nodes are still in round 1: neither lease ran out.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  WaitUntil(
      [&] {
        pump();
        return std::chrono::steady_clock::now() >= until;
      },
      std::chrono::seconds(10));
  WriteFile(dir / "go", "go\n");
  for (const auto& r : WaitAll(agents)) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(Values(r.out, "LAUNCH_ROUND"), ::testing::ElementsAre("1")) << r.err;
    EXPECT_THAT(r.err, Not(HasSubstr("lost node")));
  }
}

// The workers' store, served by the group-rank-0 agent, lets in the job's nodes (and on its own
// node its own user) and no one else: the hub, on the same network, is refused.
TEST(MultiNodeNetns, TheWorkersStoreTakesTheJobsNodesOnly) {
  NetnsLab lab(2);
  if (!lab.ok()) GTEST_SKIP() << "network namespaces unavailable: " << lab.why();
  TempDir dir;
  auto hub_coordinator = lab.StartCoordinator(dir);
  Coordinator& coord = *hub_coordinator;
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(lab.StartAgent(i, coord, dir, {"--nnodes=2", "--nproc-per-node=1"},
                                    {"--print-env", "MASTER_ADDR,MASTER_PORT,TORCHELASTIC_USE_AGENT_STORE",
                                     "--wait-lines", dir / "go", "1"}));
  }
  ASSERT_TRUE(WaitUntil([&] {
    for (auto& a : agents) a->Pump(1);
    coord.child().Pump(1);
    return std::all_of(agents.begin(), agents.end(),
                       [](const auto& a) { return !Values(a->out(), "MASTER_PORT").empty(); });
  })) << coord.child().err();
  const std::string addr = Values(agents[0]->out(), "MASTER_ADDR")[0];
  const std::string port = Values(agents[0]->out(), "MASTER_PORT")[0];
  EXPECT_THAT(Values(agents[1]->out(), "TORCHELASTIC_USE_AGENT_STORE"), ::testing::ElementsAre("True"));
  // torch 2.x's first bytes (VALIDATE, then PING 1234): the nonce comes back, or the connection
  // closes (reset, when the store closed it with those bytes unread).
  const std::string probe =
      "import socket, struct, sys\n"
      "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)\n"
      "s.sendall(b'\\x00\\xce\\xf7\\x85\\x3c\\x0d' + struct.pack('<I', 1234))\n"
      "d = b''\n"
      "try:\n"
      "    while len(d) < 4:\n"
      "        c = s.recv(4 - len(d))\n"
      "        if not c: break\n"
      "        d += c\n"
      "except ConnectionResetError:\n"
      "    pass\n"
      "print('echo %d' % struct.unpack('<I', d)[0] if len(d) == 4 else 'closed')\n";
  for (int i = 0; i < 2; ++i) {
    auto r = RunCmd(NetnsLab::In(lab.Node(i), {"/usr/bin/python3", "-c", probe, addr, port}));
    EXPECT_EQ(r.out, "echo 1234\n") << "from node " << i << ": " << r.err;
  }
  auto hub = RunCmd(NetnsLab::In(lab.Hub(), {"/usr/bin/python3", "-c", probe, addr, port}));
  EXPECT_EQ(hub.out, "closed\n") << hub.err;
  WriteFile(dir / "go", "go\n");
  for (const auto& r : WaitAll(agents)) EXPECT_EQ(r.exit_code, 0) << r.err;
  bool told = false;
  for (auto& a : agents)
    told = told || absl::StrContains(a->err(), "refused a connection from " + NetnsLab::HubAddress());
  EXPECT_TRUE(told) << "the host agent logs the refusal";
}

// ---- chaos ----

#ifdef TRAIN_MLP_BIN
// The soak against one standalone coordinator (tests/chaos.h).
TEST(MultiNodeChaos, TrainingSurvivesRandomWorkerAndAgentKillsWithExactSteps) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready()) << coord.child().err();
  ChaosPlane plane;
  plane.endpoint = coord.endpoint();
  plane.logs = [&] { return coord.child().err(); };
  plane.pump = [&] { coord.child().Pump(1); };
  RunChaos(plane);
}
#endif  // TRAIN_MLP_BIN
}  // namespace
}  // namespace launch::testing
