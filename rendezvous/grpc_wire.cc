#include "rendezvous/grpc_wire.h"

#include <grpcpp/grpcpp.h>

#include "common/tunables.h"

namespace launch {

namespace {
int Ms(std::chrono::milliseconds d) { return static_cast<int>(d.count()); }
}  // namespace

std::vector<std::pair<const char*, int>> KeepaliveArgs(GrpcEnd end) {
  // An agent pings often: it must find a coordinator that vanished (to follow another replica).
  // The coordinator pings each of thousands of agents seldom: a lost agent is found by its lease.
  std::vector<std::pair<const char*, int>> args = {
      {GRPC_ARG_KEEPALIVE_TIME_MS, Ms(end == GrpcEnd::kServer ? kServerKeepaliveTime : kKeepaliveTime)},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Ms(kKeepaliveTimeout)},
      // Heartbeats are tiny: no bandwidth-delay-product pings (each costs a ping, an ack and a
      // timer).
      {GRPC_ARG_HTTP2_BDP_PROBE, 0},
  };
  if (end == GrpcEnd::kServer) {
    // A Join is held with no data moving: ping then too.
    args.push_back({GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1});
    // Agents ping every kKeepaliveTime while their Watch stream only sends: allow it.
    args.push_back({GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, Ms(kMinPingInterval)});
    args.push_back({GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0});
  }
  return args;
}

void ApplyKeepalive(grpc::ChannelArguments* client) {
  for (const auto& [name, value] : KeepaliveArgs(GrpcEnd::kClient)) client->SetInt(name, value);
}

void ApplyKeepalive(grpc::ServerBuilder* server) {
  for (const auto& [name, value] : KeepaliveArgs(GrpcEnd::kServer)) server->AddChannelArgument(name, value);
}

}  // namespace launch
