// A single node's rendezvous inside its agent's process: the Rendezvous state machine and the
// job's straggler view behind the CoordinatorClient interface, called directly.
// The in-process gRPC coordinator it replaces for a single node cost 13 threads, a listening
// socket, a loopback connection and a slow shutdown, for one agent that no one else can reach
// (its token was known to this process only). Where a single node's job needs the gRPC service
// itself (--metrics-port serves its status), run.cc keeps the gRPC one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/coordinator_client.h"
#include "common/clock.h"
#include "rendezvous/job_view.h"
#include "rendezvous/rendezvous.h"

namespace launch {

class LocalCoordinator final : public CoordinatorClient {
 public:
  // `defaults`: the run's settings for a join that carries no run spec.
  LocalCoordinator(RendezvousConfig defaults, const Clock* clock);
  ~LocalCoordinator() override;

  absl::StatusOr<v1::Assignment> Join(const v1::JoinRequest& req, CallCanceller* cancel) override;
  // A single node's round forms at its join: answered here, with no thread waiting for it.
  std::optional<absl::StatusOr<v1::Assignment>> JoinAtOnce(const v1::JoinRequest& req) override;
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) override;
  absl::StatusOr<v1::ReportExitResponse> ReportExit(const v1::ReportExitRequest& req,
                                                    std::chrono::milliseconds timeout) override;
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& req, std::chrono::milliseconds timeout) override;
  // No stream: the agent's watch is WatchInProcess (this one ends at once, FailedPrecondition).
  std::unique_ptr<WatchStream> Watch() override;
  // The agent's watch, with no thread: answered from whichever call changes the run.
  std::unique_ptr<InProcessWatch> WatchInProcess(const v1::HeartbeatRequest& registration,
                                                 std::function<void(const v1::HeartbeatResponse&)> answered) override;
  std::string target() const override { return "in-process"; }

 private:
  class Watcher;
  // Joins and waits for the answer while `wait` (else returns nullopt when it would wait).
  std::optional<absl::StatusOr<v1::Assignment>> JoinLocked(std::unique_lock<std::mutex>& lock,
                                                           const v1::JoinRequest& req, CallCanceller* cancel,
                                                           bool wait);
  // The run a request names: nullptr (with *error set) when it is not this coordinator's run.
  Rendezvous* RunLocked(const std::string& run_id, absl::Status* error);
  // Renews the leases of the nodes watched in process, ticks the state machine (its timers are
  // looked at on every call: no thread keeps them) and answers those watches that must act.
  void TickLocked();
  void ChangedLocked(uint64_t version_before);

  const RendezvousConfig defaults_;
  const Clock* clock_;
  std::mutex mu_;
  std::condition_variable changed_;  // joins waiting for their round
  std::string run_id_;               // the one run, once the first join named it
  std::unique_ptr<Rendezvous> rdzv_;
  std::unique_ptr<JobView> view_;
  std::optional<Clock::TimePoint> next_tick_;
  std::string waiting_join_;        // the node whose JoinAtOnce found no round yet
  std::vector<Watcher*> watchers_;  // the watches in process not yet answered
};

}  // namespace launch
