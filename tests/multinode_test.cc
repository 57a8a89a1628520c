// Multi-node integration tests on loopback: several `launch` agents (separate processes), with a
// standalone `launch coordinator` or one hosted by an agent. Every process is waited for.
#include <signal.h>
#include <unistd.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

// A standalone coordinator on 127.0.0.1 (port 0, or `port`), killed by the destructor.
class Coordinator {
 public:
  explicit Coordinator(std::vector<std::string> extra = {}, int port = 0, std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {kLaunch, "coordinator", "--listen", absl::StrCat("127.0.0.1:", port)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    child_ = std::make_unique<Child>(argv, env);
    ready_ = WaitUntil([&] {
      child_->Pump(5);
      return absl::StrContains(child_->out(), "listening on");
    });
    auto pos = child_->out().find("127.0.0.1:");
    if (ready_ && pos != std::string::npos) {
      absl::SimpleAtoi(child_->out().substr(pos + 10, child_->out().find_first_not_of("0123456789", pos + 10) - pos - 10),
                       &port_);
    }
  }
  ~Coordinator() {
    if (child_ && ProcessAlive(child_->pid())) Kill(SIGTERM);
  }
  bool ready() const { return ready_; }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  RunResult Kill(int sig) {
    ::kill(child_->pid(), sig);
    return child_->Wait(std::chrono::seconds(20));
  }
  Child& child() { return *child_; }

 private:
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

const char* kEnvKeys = "RANK,LOCAL_RANK,WORLD_SIZE,LOCAL_WORLD_SIZE,GROUP_RANK,GROUP_WORLD_SIZE,MASTER_ADDR,MASTER_PORT,"
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
  agents.push_back(std::make_unique<Child>(Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=2"}, {"--print-env", kEnvKeys})));
  agents.push_back(std::make_unique<Child>(Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1"}, {"--print-env", kEnvKeys})));
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
    agents.push_back(std::make_unique<Child>(Agent(
        coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=2"},
        {"--stamp", dir / "starts", "--pid-file", dir / "pids{restart}", "--wait-lines", dir / "pids{restart}", "2",
         "--fail-rank", "1", "5", "--sleep-below-restart", "1", "0", "--print-env", "TORCHELASTIC_RESTART_COUNT"})));
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
    agents.push_back(std::make_unique<Child>(Agent(
        coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=1"},
        {"--pid-file", dir / "pids{restart}", "--wait-lines", dir / "pids{restart}", "2", "--stamp", dir / "starts",
         "--sleep-below-restart", "1", "0.2", "--fail-below-restart", "1", "3"})));
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

TEST(MultiNode, CoordinatorKilledAndRestartedMidJobTheJobCompletesWithoutARestart) {
  const int port = FreePort();
  auto coord = std::make_unique<Coordinator>(std::vector<std::string>{}, port);
  ASSERT_TRUE(coord->ready());
  TempDir dir;
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<Child>(
        Agent(coord->endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--max-restarts=3"},
              {"--pid-file", dir / "pids", "--wait-lines", dir / "go", "1", "--print-env", "TORCHELASTIC_RESTART_COUNT"})));
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
    for (size_t pos = err.find("re-registered"); pos != std::string::npos; pos = err.find("re-registered", pos + 1)) ++n;
    return n == 2;
  }));
  WriteFile(dir / "go", "go\n");
  for (const auto& r : WaitAll(agents)) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("TORCHELASTIC_RESTART_COUNT=0"));
    EXPECT_THAT(r.out, Not(HasSubstr("TORCHELASTIC_RESTART_COUNT=1")));
  }
}

TEST(MultiNode, JoinBeyondMaxAndMismatchedSettingsAreRejected) {
  Coordinator coord;
  ASSERT_TRUE(coord.ready());
  TempDir dir;
  Child a(Agent(coord.endpoint(), {"--nnodes=1", "--nproc-per-node=1"}, {"--pid-file", dir / "pids", "--sleep", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    a.Pump(1);
    return ReadPids(dir / "pids").size() == 1;
  }));
  auto extra = RunCmd(Agent(coord.endpoint(), {"--nnodes=1", "--nproc-per-node=1"}, {}));
  EXPECT_EQ(extra.exit_code, 1);
  EXPECT_THAT(extra.err, HasSubstr("already runs with its 1 node(s)"));
  auto mismatch = RunCmd(Agent(coord.endpoint(), {"--nnodes=1:2", "--nproc-per-node=1"}, {}));
  EXPECT_EQ(mismatch.exit_code, 1);
  EXPECT_THAT(mismatch.err, HasSubstr("this node asks for --nnodes 1:2"));
  coord.child().Pump(50);
  EXPECT_THAT(coord.child().err(), HasSubstr("rejected join"));
  EXPECT_THAT(coord.child().err(), HasSubstr("ipv4:127.0.0.1:"));
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

// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
struct TestCerts {
  explicit TestCerts(const TempDir& dir) : ok(true) {
    auto run = [&](std::vector<std::string> argv) {
      auto r = RunCmd(argv);
      if (r.exit_code != 0) {
        ok = false;
        error += absl::StrCat("exit ", r.exit_code, ": ", r.err);
      }
    };
    WriteFile(dir / "server.ext", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
    WriteFile(dir / "client.ext", "extendedKeyUsage=clientAuth\n");
    const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
    auto req = [&](std::vector<std::string> head, std::vector<std::string> rest) {
      head.insert(head.end(), ec.begin(), ec.end());
      head.insert(head.end(), rest.begin(), rest.end());
      return head;
    };
    run(req({"/usr/bin/openssl", "req", "-x509"}, {"-keyout", dir / "ca.key", "-out", dir / "ca.pem", "-days", "2", "-subj", "/CN=launch-test-ca"}));
    for (std::string who : {"server", "client"}) {
      run(req({"/usr/bin/openssl", "req"}, {"-keyout", dir / (who + ".key"), "-out", dir / (who + ".csr"), "-subj", "/CN=" + who}));
      run({"/usr/bin/openssl", "x509", "-req", "-in", dir / (who + ".csr"), "-CA", dir / "ca.pem", "-CAkey", dir / "ca.key",
           "-CAcreateserial", "-out", dir / (who + ".pem"), "-days", "2", "-extfile", dir / (who + ".ext")});
    }
    ca = dir / "ca.pem";
    server_cert = dir / "server.pem";
    server_key = dir / "server.key";
    client_cert = dir / "client.pem";
    client_key = dir / "client.key";
  }
  bool ok;
  std::string error, ca, server_cert, server_key, client_cert, client_key;
};

std::vector<RunResult> RunTwoAgents(const std::string& endpoint, const std::vector<std::string>& flags,
                                    const std::vector<std::string>& env = {}) {
  std::vector<std::string> f = {"--nnodes=2", "--nproc-per-node=1"};
  f.insert(f.end(), flags.begin(), flags.end());
  std::vector<std::unique_ptr<Child>> agents;
  for (int i = 0; i < 2; ++i) agents.push_back(std::make_unique<Child>(Agent(endpoint, f, {"--print-env", kEnvKeys}), env));
  return WaitAll(agents);
}

TEST(MultiNodeSecurity, TokenIsRequiredOnEveryCall) {
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
      Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1", "--rdzv-token-file", dir / "token"}, {"--print-env", kEnvKeys})));
  agents.push_back(std::make_unique<Child>(Agent(coord.endpoint(), {"--nnodes=2", "--nproc-per-node=1"}, {"--print-env", kEnvKeys}),
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
  ExpectOneJob(RunTwoAgents(mtls.endpoint(), {"--tls-ca", certs.ca, "--tls-cert", certs.client_cert, "--tls-key",
                                              certs.client_key}),
               2, 2);
  auto bad = RunCmd(Agent(mtls.endpoint(), {"--nnodes=2", "--tls-ca", dir / "server.ext"}, {}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("expected a PEM file"));
}

}  // namespace
}  // namespace launch::testing
