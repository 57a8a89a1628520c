// The agent's side of the rendezvous protocol, behind an interface (a fake stands in for tests).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "launch.grpc.pb.h"

namespace launch {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) = 0;
  virtual absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req) = 0;
};

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  // `join_timeout` bounds how long a Join may wait for its round to form.
  GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::chrono::seconds join_timeout);
  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override;
  absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req) override;

 private:
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::chrono::seconds join_timeout_;
};

// grpc::Status → absl::Status, keeping the code and the message.
absl::Status FromGrpc(const grpc::Status& s, const std::string& what);

}  // namespace launch
