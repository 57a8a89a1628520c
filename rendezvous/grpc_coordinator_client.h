// The coordinator client over gRPC: each call with its deadline and the run's token.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "launch.grpc.pb.h"
#include "rendezvous/coordinator_client.h"

namespace launch {

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  // `join_timeout` bounds how long a Join may wait for its round to form; `token` goes with
  // every call when not empty.
  GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::string target, std::string token,
                        std::chrono::milliseconds join_timeout);
  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req, CallCanceller* cancel) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override;
  absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req,
                                                    std::chrono::milliseconds timeout) override;
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& req, std::chrono::milliseconds timeout) override;
  std::unique_ptr<WatchStream> Watch() override;
  std::string target() const override { return target_; }
  // Whether a Join waits for a coordinator that is not up yet (the default: another node may be
  // starting it) or fails at once (one of several replicas: the next one is tried instead).
  void set_wait_for_ready(bool wait) { wait_for_ready_ = wait; }
  void SetNodeKey(const std::string& key) override;
  // Without a token of its own, the client of a coordinator on loopback sends the token that
  // coordinator published for its user (rendezvous/local_token.h), read at each call.
  void UseLocalToken(int port) { local_port_ = port; }

 private:
  std::string CurrentToken() const;
  grpc::Status StaleLocalToken(const grpc::Status& s, const std::string& token) const;
  // One call with a fresh context carrying the credentials; a call refused with a local token
  // that has changed since is made again (the coordinator published it after the call was
  // prepared: it was starting, or restarted).
  // `timeout`: the call's gRPC deadline (none: the caller bounds the wait itself).
  grpc::Status Authed(std::optional<std::chrono::milliseconds> timeout,
                      const std::function<grpc::Status(grpc::ClientContext*)>& call) const;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::string target_, token_;
  std::chrono::milliseconds join_timeout_;
  bool wait_for_ready_ = true;
  mutable std::mutex key_mu_;  // calls come from the agent's threads
  std::string node_key_;       // key_mu_
  int local_port_ = 0;
};

// grpc::Status → absl::Status, keeping the code and the message.
absl::Status FromGrpc(const grpc::Status& s, const std::string& what);

}  // namespace launch
