// The tunables table: each default is read from it by every layer, the help prints it, and both
// ends of a gRPC connection take the same keepalive.
#include "common/tunables.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <set>
#include <string>

#include "agent/agent_options.h"
#include "rendezvous/coordinator_session.h"
#include "agent/group_supervisor.h"
#include "rendezvous/grpc_wire.h"
#include "common/limits.h"
#include "gtest/gtest.h"
#include "launcher/options.h"
#include "rendezvous/rendezvous.h"

namespace launch {
namespace {

TEST(Tunables, EveryRowIsNamedOnceAndDocumented) {
  std::set<std::string> names;
  for (const TunableDoc& t : kTunables) {
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
    EXPECT_GT(std::string(t.doc).size(), 10u) << t.name;
    EXPECT_GT(std::string(t.default_value).size(), 0u) << t.name;
  }
}

// The flags' seconds and the agent's and coordinator's milliseconds are the same defaults.
TEST(Tunables, EveryLayerStartsFromTheTable) {
  const LaunchConfig flags;
  const AgentOptions agent;
  const RendezvousConfig rdzv;
  EXPECT_EQ(SecondsToMs(flags.stop_timeout), agent.stop_timeout);
  EXPECT_EQ(agent.stop_timeout, kDefaultStopTimeout);
  EXPECT_EQ(SecondsToMs(flags.rdzv.join_timeout), rdzv.join_timeout);
  EXPECT_EQ(SecondsToMs(flags.rdzv.last_call_timeout), rdzv.last_call_timeout);
  EXPECT_EQ(SecondsToMs(flags.rdzv.close_timeout), rdzv.close_timeout);
  EXPECT_EQ(SecondsToMs(flags.rdzv.heartbeat_timeout), rdzv.heartbeat_timeout);
  EXPECT_EQ(SecondsToMs(flags.rdzv.heartbeat_interval), agent.heartbeat_interval);
  EXPECT_EQ(agent.coordinator_patience, rdzv.close_timeout);
  EXPECT_EQ(CoordinatorSession::Options{}.patience, rdzv.close_timeout);
  EXPECT_EQ(flags.straggler_factor, rdzv.straggler_factor);
  EXPECT_EQ(SecondsToMs(flags.monitor_interval), kDefaultMonitorInterval);
  EXPECT_EQ(StopEscalation{}.capture_grace, kCaptureStacksGrace);
  EXPECT_EQ(StaticTopology{}.master_port, kDefaultMasterPort);
  EXPECT_EQ(CoordinatorConfig{}.listen, "0.0.0.0:" + std::to_string(kDefaultRendezvousPort));
}

TEST(Tunables, HelpPrintsTheTablesDefaults) {
  ::testing::internal::CaptureStdout();
  auto parsed = ParseLaunchArgs({"launch", "--help"});
  const std::string help = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->help);
  // CLI11 wraps long help lines: compare with the whitespace squeezed.
  std::string flat;
  for (char c : help) {
    if (c == '\n' || c == ' ') {
      if (!flat.empty() && flat.back() != ' ') flat += ' ';
    } else {
      flat += c;
    }
  }
  EXPECT_NE(flat.find("(default port 29400)"), std::string::npos) << flat;
  EXPECT_NE(flat.find("SIGKILL when stopping workers (default 30)"), std::string::npos) << flat;
  EXPECT_NE(flat.find("(default 5; at least 1; 0: off)"), std::string::npos) << flat;
  EXPECT_NE(flat.find("(default 1.2; 0: off)"), std::string::npos) << flat;
  EXPECT_NE(flat.find("the larger of 10x its median step time and 300; 0: off"), std::string::npos) << flat;
}

std::map<std::string, int> Args(GrpcEnd end) {
  std::map<std::string, int> m;
  for (const auto& [name, value] : KeepaliveArgs(end)) m[name] = value;
  return m;
}

// A server that refuses the client's pings (too frequent) closes its connections with
// GOAWAY "too_many_pings": the two ends must be set together.
// An agent pings often (it must find a vanished coordinator to follow another replica); the
// coordinator pings its thousands of agents seldom (a lost agent's lease finds it) and takes the
// agents' pings.
TEST(Tunables, AgentsPingOftenTheCoordinatorSeldomAndTakesTheirPings) {
  auto client = Args(GrpcEnd::kClient);
  auto server = Args(GrpcEnd::kServer);
  EXPECT_EQ(server.at(GRPC_ARG_KEEPALIVE_TIME_MS), 30000);
  EXPECT_LT(client.at(GRPC_ARG_KEEPALIVE_TIME_MS), server.at(GRPC_ARG_KEEPALIVE_TIME_MS));
  EXPECT_EQ(client.at(GRPC_ARG_KEEPALIVE_TIMEOUT_MS), server.at(GRPC_ARG_KEEPALIVE_TIMEOUT_MS));
  EXPECT_LT(server.at(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS), client.at(GRPC_ARG_KEEPALIVE_TIME_MS));
  EXPECT_EQ(server.at(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS), 1);
  EXPECT_EQ(client.count(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS), 0u);
  EXPECT_EQ(client.at(GRPC_ARG_KEEPALIVE_TIME_MS), 5000);
  EXPECT_EQ(client.at(GRPC_ARG_KEEPALIVE_TIMEOUT_MS), 3000);
}

}  // namespace
}  // namespace launch
