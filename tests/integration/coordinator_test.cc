// The single node's in-process coordinator under the real `launch`: its listeners and token, and
// a launch stopped for a while.

#include <signal.h>

#include <algorithm>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/net.h"
#include "launch.grpc.pb.h"
#include <grpcpp/grpcpp.h>
#include "tests/integration/launch_cmd.h"
#include "tests/test_util.h"

namespace launch::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The lines of the run's metrics.jsonl under `log_dir` (0 before the first sample).
size_t MetricsLines(const std::string& log_dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(log_dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() == "metrics.jsonl") {
      std::string text = ReadFile(it->path().string());
      return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
    }
  }
  return 0;
}

// SIGSTOP/SIGCONT of launch (or a paused VM) for longer than the heartbeat timeout restarted
// healthy workers: the in-process coordinator expired its own agent's lease. A single node's
// lease has no timeout (plan.cc), and its watch is answered in process, so a stop costs nothing.
// The monitor's samples are calls that look at the leases: the test lets two pass after the stop.
TEST(Launch, StoppingLaunchForAWhileDoesNotRestartItsWorkers) {
  TempDir dir;
  const std::string logs = dir / "logs";
  Child c(Cmd({"--nproc-per-node=1", "--rdzv-conf=heartbeat_timeout=1,heartbeat_interval=0.2", "--monitor-interval=0.1",
               "--log-dir", logs},
              {"--pid-file", dir / "pids", "--wait-lines", dir / "go", "1", "--exit", "0"}));
  ASSERT_TRUE(WaitUntil([&] {
    c.Pump(1);
    return ReadPids(dir / "pids").size() == 1 && MetricsLines(logs) >= 1;
  }));
  ::kill(c.pid(), SIGSTOP);
  const size_t before = MetricsLines(logs);
  for (int i = 0; i < 300; ++i) c.Pump(10);  // the stimulus: stopped for 3 s
  ::kill(c.pid(), SIGCONT);
  // A line is written before its sample is sent: the second after the stop means the first was
  // taken by the coordinator.
  EXPECT_TRUE(WaitUntil([&] {
    c.Pump(5);
    return MetricsLines(logs) >= before + 2;
  })) << c.err();
  WriteFile(dir / "go", "go\n");
  auto r = c.Wait();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadPids(dir / "pids").size(), 1u) << "the worker was restarted: " << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("lost node")));
}

// `--rdzv-endpoint=localhost:0` (torch 2.x scripts and torchtitan pass it): the coordinator is
// hosted on a free port and the agent joins that port. It used to join port 0 and wait the whole
// join timeout.
TEST(Launch, AnEndpointOnPortZeroIsHostedOnAFreePortAndJoined) {
  for (const char* endpoint : {"localhost:0", "127.0.0.1:0"}) {
    auto r = RunCmd(Cmd({"--nnodes=1", "--nproc-per-node=2", std::string("--rdzv-endpoint=") + endpoint,
                         "--rdzv-conf=join_timeout=30"},
                        {"--print-env", "WORLD_SIZE", "--exit", "0"}),
                    {}, std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code, 0) << endpoint << ": " << r.err;
    size_t lines = 0;
    for (size_t at = r.out.find("WORLD_SIZE=2"); at != std::string::npos; at = r.out.find("WORLD_SIZE=2", at + 1))
      ++lines;
    EXPECT_EQ(lines, 2u) << endpoint << ": " << r.out;
    EXPECT_THAT(r.err, HasSubstr("hosting the rendezvous coordinator at")) << endpoint;
  }
  // Another node could not learn the port: refused at once, with one line.
  auto two = RunCmd(Cmd({"--nnodes=2", "--nproc-per-node=1", "--rdzv-endpoint=localhost:0"}, {"--exit", "0"}), {},
                    std::chrono::seconds(30));
  EXPECT_EQ(two.exit_code, 2) << two.err;
  EXPECT_THAT(two.err, HasSubstr("--rdzv-endpoint=localhost:0: port 0 (any free port) works only for a coordinator "
                                 "hosted here with --nnodes=1"));
}

// A single node's coordinator listened on loopback with no token: any local user could send it
// a forged heartbeat. Every call then needed a token only launch knew; now a single node's
// rendezvous is no server at all, so its job listens on the workers' store (MASTER_PORT) alone,
// which speaks no gRPC. With --metrics-port the gRPC coordinator is back (the endpoint serves its
// status), and it still refuses calls without the token.
TEST(Launch, ASingleNodeJobListensOnlyWhereItsWorkersNeedIt) {
  for (bool metrics : {false, true}) {
    TempDir dir;
    std::vector<std::string> flags = {"--nproc-per-node=1"};
    int metrics_port = 0;
    if (metrics) {
      auto free = PickFreePort("127.0.0.1");
      ASSERT_TRUE(free.ok()) << free.status();
      metrics_port = *free;
      flags.push_back("--metrics-port=" + std::to_string(metrics_port));
    }
    // The metrics endpoint's scrapers need a token; it is then the coordinator's too.
    std::vector<std::string> env;
    if (metrics) env.push_back("LAUNCH_RDZV_TOKEN=a-token-for-the-scrapers");
    Child c(Cmd(flags, {"--pid-file", dir / "pids", "--print-env", "MASTER_PORT", "--wait-lines", dir / "go", "1",
                        "--exit", "0"}),
            env);
    ASSERT_TRUE(WaitUntil([&] {
      c.Pump(1);
      return ReadPids(dir / "pids").size() == 1 && absl::StrContains(c.out(), "MASTER_PORT=");
    }));
    const std::string out = c.out();
    const int store_port = std::stoi(out.substr(out.find("MASTER_PORT=") + 12));
    std::vector<int> ports = ListeningTcpPorts(c.pid());
    ports.erase(std::remove(ports.begin(), ports.end(), metrics_port), ports.end());
    ASSERT_EQ(ports.size(), metrics ? 2u : 1u) << "metrics " << metrics;
    EXPECT_EQ(std::count(ports.begin(), ports.end(), store_port), 1);
    for (int port : ports) {
      auto stub = v1::Rendezvous::NewStub(
          grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      v1::HeartbeatRequest hb;
      hb.set_run_id("any");
      hb.set_node_id("intruder");
      v1::HeartbeatResponse resp;
      grpc::Status st = stub->Heartbeat(&ctx, hb, &resp);
      if (port == store_port) {
        EXPECT_FALSE(st.ok());
        continue;
      }
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << port << ": " << st.error_message();
    }
    WriteFile(dir / "go", "go\n");
    auto r = c.Wait();
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
}

}  // namespace
}  // namespace launch::testing
