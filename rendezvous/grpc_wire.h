// What both ends of a connection between agents and their coordinator must agree on, declared
// once for the client (rendezvous/grpc_coordinator_client.h, launch status) and the server
// (rendezvous/coordinator.h): the metadata key of the rendezvous token, and the keepalive pings.
#pragma once

#include <utility>
#include <vector>

namespace grpc {
class ChannelArguments;
class ServerBuilder;
}  // namespace grpc

namespace launch {

// Metadata key that carries the rendezvous token on every RPC.
inline constexpr char kTokenMetadataKey[] = "x-launch-token";
// Metadata key that carries a node's own key (Assignment.lease_key, binary: hence "-bin") on every
// RPC that names the node after its join: within the token's trust, a node speaks only for itself.
inline constexpr char kNodeKeyMetadataKey[] = "x-launch-node-key-bin";

// The gRPC channel arguments of keepalive (common/tunables.h's values) for one end: a client pings
// to find a coordinator that vanished without closing the connection (a cut link); a server pings
// to find agents that vanished while their Join is held, and lets the clients' pings in.
enum class GrpcEnd { kClient, kServer };
std::vector<std::pair<const char*, int>> KeepaliveArgs(GrpcEnd end);

// KeepaliveArgs applied to a client's channel arguments or to a server.
void ApplyKeepalive(grpc::ChannelArguments* client);
void ApplyKeepalive(grpc::ServerBuilder* server);

}  // namespace launch
