// The agent's side of the rendezvous protocol, behind an interface with no gRPC in it: the gRPC
// client (grpc_coordinator_client.h), the in-process LocalCoordinator and the tests' fake implement it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "launch.pb.h"

namespace launch {

// Lets another thread cut a blocking call short (a held Join) at once.
class CallCanceller {
 public:
  void Cancel();
  bool cancelled() const;
  void Reset();  // before reuse, with no call in flight
  // For clients: how to cut the call in flight short (called at most once, under a lock, from
  // Cancel); false when already cancelled.
  bool Attach(std::function<void()> cut_short);
  void Detach();

 private:
  mutable std::mutex mu_;
  std::function<void()> cut_short_;
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

// A watch held inside the coordinator's own process (CoordinatorClient::WatchInProcess);
// destroying it ends the watch.
class InProcessWatch {
 public:
  virtual ~InProcessWatch() = default;
};

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual std::unique_ptr<WatchStream> Watch() = 0;
  // For a coordinator in this process: a watch with no thread and no heartbeats (a node in the
  // coordinator's process is alive while the process is). `answered` is called once, under the
  // coordinator's lock, so it must only record and wake, with the first answer the node must act
  // on. `registration` is what a Watch stream would send first. nullptr: this client needs a
  // Watch stream, and a thread to hold it.
  virtual std::unique_ptr<InProcessWatch> WatchInProcess(
      const v1::HeartbeatRequest& /*registration*/, std::function<void(const v1::HeartbeatResponse&)> /*answered*/) {
    return nullptr;
  }
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
  // The node's own key, from its assignment: sent with every later call that names the node
  // (a coordinator in this process needs none).
  virtual void SetNodeKey(const std::string& /*key*/) {}
};

// Whether a failed call is worth retrying: the coordinator is unreachable or restarting.
bool CoordinatorUnreachable(const absl::Status& s);

}  // namespace launch
