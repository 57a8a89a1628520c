// The agent's client of replicated coordinators (--rdzv-endpoint h1:p,h2:p,h3:p): one client per
// replica behind one interface. Calls go to the replica that answered last; one that is
// unreachable, or stands by (it answers UNAVAILABLE, naming the leader), sends the call on to the
// next, so the agent follows the leader without knowing which replica leads.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rendezvous/coordinator_client.h"

namespace launch {

class FailoverCoordinatorClient final : public CoordinatorClient {
 public:
  explicit FailoverCoordinatorClient(std::vector<std::unique_ptr<CoordinatorClient>> replicas);

  std::unique_ptr<WatchStream> Watch() override;
  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req, CallCanceller* cancel) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override;
  absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req,
                                                    std::chrono::milliseconds timeout) override;
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& req, std::chrono::milliseconds timeout) override;
  // Every replica gets the node's key: whichever leads checks it.
  void SetNodeKey(const std::string& key) override;
  // The replica in use now.
  std::string target() const override;
  // Every replica's target, "h1:p,h2:p".
  std::string targets() const;
  // Moves on from `from` (the index of a replica found unreachable) to the next one.
  void Next(size_t from);

 private:
  // Calls `call` on the replica in use, then on each other while they are unreachable.
  template <typename T, typename F>
  absl::StatusOr<T> OnSomeReplica(F&& call);

  std::vector<std::unique_ptr<CoordinatorClient>> replicas_;
  mutable std::mutex mu_;
  size_t current_ = 0;  // under mu_
};

}  // namespace launch
