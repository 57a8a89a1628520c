// The rendezvous coordinator as a gRPC service: a thin, locked wrapper around one Rendezvous
// state machine per run id. Single-node runs host it in-process on 127.0.0.1 (port 0).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "launch.grpc.pb.h"
#include "launcher/rendezvous.h"

namespace launch {

class CoordinatorService final : public v1::Rendezvous::Service {
 public:
  CoordinatorService(RendezvousConfig defaults, const Clock* clock)
      : defaults_(defaults), clock_(clock) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    v1::JoinResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status ReportExit(grpc::ServerContext* ctx, const v1::ReportExitRequest* req,
                          v1::ReportExitResponse* resp) override;
  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest* req,
                      v1::StatusResponse* resp) override;

  // Wakes every waiting Join so the server can shut down.
  void Shutdown();

 private:
  Rendezvous* RunFor(const std::string& run_id);  // mu_ held

  RendezvousConfig defaults_;
  const Clock* clock_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool shutting_down_ = false;
  std::map<std::string, std::unique_ptr<Rendezvous>> runs_;
};

// A coordinator listening on an address, with its own gRPC threads.
class CoordinatorServer {
 public:
  // "127.0.0.1:0" picks a free port; port() tells which.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const std::string& listen,
                                                                   RendezvousConfig defaults,
                                                                   const Clock* clock);
  ~CoordinatorServer();
  int port() const { return port_; }
  std::string address() const { return address_; }

 private:
  CoordinatorServer() = default;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

// Message size limit for every rendezvous RPC (the messages are small; anything big is an attack
// or a bug).
constexpr int kMaxRendezvousMessageBytes = 1 << 20;

}  // namespace launch
