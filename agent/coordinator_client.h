// The agent's side of the rendezvous protocol, behind an interface (a fake stands in for tests).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "launch.grpc.pb.h"

namespace launch {

// Lets another thread cut a blocking call short (a held Join) at once.
class CallCanceller {
 public:
  void Cancel();
  bool cancelled() const;
  void Reset();  // before reuse, with no call in flight
  // For clients: register the call in flight; false when already cancelled.
  bool Attach(grpc::ClientContext* ctx);
  void Detach();

 private:
  mutable std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;
  bool cancelled_ = false;
};

// One Watch stream (launch.proto): one thread may Send while another Receives; Cancel from any.
class WatchStream {
 public:
  virtual ~WatchStream() = default;
  virtual bool Send(const v1::HeartbeatRequest& hb) = 0;  // false: the stream is broken
  // Blocks until the coordinator's one answer (true) or the stream's end (false).
  virtual bool Receive(v1::HeartbeatResponse* resp) = 0;
  // How the stream ended, once Receive returned false.
  virtual absl::Status Finish() = 0;
  virtual void Cancel() = 0;
};

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual std::unique_ptr<WatchStream> Watch() = 0;
  // Waits for the round to form (bounded by the coordinator's join timeout).
  virtual absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req, CallCanceller* cancel = nullptr) = 0;
  // The join's answer when the client has it without waiting (a coordinator in this process whose
  // round forms at this join), so that no thread is started to wait for it; nullopt: call Join,
  // which takes this join as a retry.
  virtual std::optional<absl::StatusOr<v1::Assignment>> JoinAtOnce(const v1::JoinRequest&) { return std::nullopt; }
  // One lease renewal, answered at once.
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) = 0;
  virtual absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req,
                                                            std::chrono::milliseconds timeout) = 0;
  // A monitor sample; answered with the job's straggler events. Best effort: a client that
  // cannot send samples (a test's fake) says so.
  virtual absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest&, std::chrono::milliseconds) {
    return absl::UnimplementedError("this coordinator client sends no samples");
  }
  // "host:port" for messages.
  virtual std::string target() const = 0;
};

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

 private:
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::string target_, token_;
  std::chrono::milliseconds join_timeout_;
};

// grpc::Status → absl::Status, keeping the code and the message.
absl::Status FromGrpc(const grpc::Status& s, const std::string& what);

// Whether a failed call is worth retrying: the coordinator is unreachable or restarting.
bool CoordinatorUnreachable(const absl::Status& s);

}  // namespace launch
