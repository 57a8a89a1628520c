// The agent's standing with its coordinator, in one place: how long to wait between tries when
// the coordinator is away (backoff), how long it is waited for (patience), and how a coordinator
// that forgot this node (it restarted) is told again (re-registration). The join, the reports and
// the watch all follow it. Time comes from an injected Clock and every wait from an injected
// Waiter, so the policy is tested with a fake clock and a fake client in microseconds.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "rendezvous/coordinator_client.h"
#include "common/clock.h"
#include "common/tunables.h"

namespace launch {

// Exponential backoff between the tries at an unreachable coordinator, and since when it has
// been unreachable.
class RetryPacer {
 public:
  struct Options {
    std::chrono::milliseconds first = kRetryFirstDelay;
    std::chrono::milliseconds max = kRetryMaxDelay;
  };
  RetryPacer(Options opts, const Clock* clock) : opts_(opts), clock_(clock), next_(opts.first) {}
  // A try found the coordinator unreachable: the delay before the next try.
  std::chrono::milliseconds Unreachable();
  // A try reached it: the next unreachable spell starts from the first delay.
  void Reached();
  bool unreachable() const { return since_.has_value(); }
  // How long it has been unreachable (zero when it was reached at the last try).
  Clock::Duration unreachable_for() const;

 private:
  Options opts_;
  const Clock* clock_;
  std::chrono::milliseconds next_;
  std::optional<Clock::TimePoint> since_;
};

// Waits until `fd` is readable (0), `timeout` passes (-1), or a terminating signal arrives (its
// number); fd < 0: only the timeout and signals; no timeout: for ever. The agent's is its signal
// fd's poll loop; tests advance a fake clock instead.
using Waiter = std::function<int(int fd, std::optional<std::chrono::milliseconds> timeout)>;

class CoordinatorSession {
 public:
  struct Options {
    std::string run_id;
    v1::NodeIdentity node;
    v1::RunSpec spec;
    RetryPacer::Options retry;
    // How long an unreachable coordinator is waited for by a report, and in any call when the
    // coordinator lives in another node's agent (that node is then gone, and so is the job).
    std::chrono::milliseconds patience = kDefaultCloseTimeout;
  };
  CoordinatorSession(Options opts, CoordinatorClient* client, const Clock* clock, Waiter wait)
      : opts_(std::move(opts)), client_(client), clock_(clock), wait_(std::move(wait)) {}

  // Joins a round with the request `make_request` builds for each try (the agent's proposes the
  // same MASTER_PORT every try: its store's port, held since the first), riding out a coordinator
  // that restarts until the join timeout. *signal: the signal that cut it short (then the status
  // is Cancelled).
  absl::StatusOr<v1::Assignment> Join(const std::function<absl::StatusOr<v1::JoinRequest>()>& make_request,
                                      int* signal);
  // Reports this node's exits for `a`'s round and returns the coordinator's verdict; a coordinator
  // that does not know the run (it restarted) is re-registered first. Retries an unreachable one
  // for the patience.
  absl::StatusOr<v1::ReportExitResponse> Report(const v1::ReportExitRequest& req, const v1::Assignment& a, int* signal);
  // The heartbeat that tells a coordinator everything it needs to rebuild the run (the first
  // message of every Watch stream, and the re-registration before a report).
  v1::HeartbeatRequest Registration(const v1::Assignment& a) const;
  // The node whose agent hosts the coordinator (from the last assignment); empty: standalone.
  void set_coordinator_host(std::string host) { coordinator_host_ = std::move(host); }
  const std::string& coordinator_host() const { return coordinator_host_; }
  const Options& options() const { return opts_; }
  CoordinatorClient* client() const { return client_; }
  const Clock* clock() const { return clock_; }

 private:
  Options opts_;
  CoordinatorClient* client_;
  const Clock* clock_;
  Waiter wait_;
  std::string coordinator_host_;
};

// Why a job ends when its agent-hosted coordinator is gone (for the watch and the agent alike).
// An assignment from the wire, checked before any of its numbers sizes or names anything: the
// round and restart counts, this node's place among `local_world_size` ranks of the world, the
// master's port, the lease port and key, the member addresses. The error names the field, its
// value and what was expected, in one line.
absl::Status ValidateAssignment(const v1::Assignment& a, int local_world_size);

std::string HostedCoordinatorGone(const std::string& target, const std::string& host,
                                  std::chrono::milliseconds patience);

}  // namespace launch
