#include "rendezvous/coordinator_session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rendezvous/background_call.h"
#include "probes/process.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace launch {

std::string HostedCoordinatorGone(const std::string& target, const std::string& host,
                                  std::chrono::milliseconds patience) {
  return absl::StrCat("the coordinator at ", target, ", hosted by the agent of ", host, ", has been unreachable for ",
                      patience.count() / 1000.0,
                      " s: that node is gone and the job cannot go on without it (a standalone `launch "
                      "coordinator` survives the loss of any node)");
}

std::chrono::milliseconds RetryPacer::Unreachable() {
  if (!since_) since_ = clock_->Now();
  const std::chrono::milliseconds delay = next_;
  next_ = std::min(next_ * 2, opts_.max);
  return delay;
}

void RetryPacer::Reached() {
  since_.reset();
  next_ = opts_.first;
}

Clock::Duration RetryPacer::unreachable_for() const {
  return since_ ? clock_->Now() - *since_ : Clock::Duration::zero();
}

v1::HeartbeatRequest CoordinatorSession::Registration(const v1::Assignment& a) const {
  v1::HeartbeatRequest hb;
  hb.set_run_id(opts_.run_id);
  hb.set_node_id(opts_.node.node_id());
  hb.set_round(a.round());
  *hb.mutable_node() = opts_.node;
  *hb.mutable_assignment() = a;
  *hb.mutable_spec() = opts_.spec;
  return hb;
}

absl::StatusOr<v1::Assignment> CoordinatorSession::Join(
    const std::function<absl::StatusOr<v1::JoinRequest>()>& make_request, int* signal) {
  *signal = 0;
  const auto deadline = clock_->Now() + SecondsToMs(opts_.spec.join_timeout_s());
  RetryPacer pacer(opts_.retry, clock_);
  auto cancelled = [&](int sig) {
    *signal = sig;
    return absl::CancelledError(absl::StrCat("stopped by ", SignalName(sig), " while waiting for the rendezvous"));
  };
  for (;;) {
    ASSIGN_OR_RETURN(v1::JoinRequest req, make_request());
    absl::StatusOr<v1::Assignment> result = absl::UnknownError("join did not run");
    if (auto at_once = client_->JoinAtOnce(req)) {
      result = std::move(*at_once);
    } else {
      BackgroundCall call;
      RETURN_IF_ERROR(call.Start([&](CallCanceller* c) { result = client_->Join(req, c); }));
      if (int sig = wait_(call.fd(), std::nullopt); sig > 0) {
        call.Cancel();
        call.Wait();
        return cancelled(sig);
      }
      call.Wait();
    }
    if (result.ok() || !CoordinatorUnreachable(result.status()) || clock_->Now() >= deadline) return result;
    const bool first = !pacer.unreachable();
    const std::chrono::milliseconds delay = pacer.Unreachable();
    if (!coordinator_host_.empty() && pacer.unreachable_for() >= opts_.patience) {
      return absl::UnavailableError(HostedCoordinatorGone(client_->target(), coordinator_host_, opts_.patience));
    }
    // The coordinator went away while the round was forming: wait for it to come back.
    if (first) spdlog::warn("{}; retrying", std::string(result.status().message()));
    if (int sig = wait_(-1, delay); sig > 0) return cancelled(sig);
  }
}

absl::StatusOr<v1::ReportExitResponse> CoordinatorSession::Report(const v1::ReportExitRequest& req,
                                                                  const v1::Assignment& a, int* signal) {
  *signal = 0;
  const auto deadline = clock_->Now() + opts_.patience;
  RetryPacer pacer(opts_.retry, clock_);
  for (;;) {
    auto resp = client_->ReportExit(req, kReportDeadline);
    if (resp.ok()) return resp;
    if (absl::IsNotFound(resp.status())) {
      // A restarted coordinator that has not heard of the run yet: re-register, then report.
      if (client_->Heartbeat(Registration(a)).ok()) {
        resp = client_->ReportExit(req, kReportDeadline);
        if (resp.ok()) return resp;
      }
    }
    if (!CoordinatorUnreachable(resp.status()) && !absl::IsNotFound(resp.status())) return resp.status();
    if (clock_->Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("gave up on the coordinator at ", client_->target(), " after ",
                                                 opts_.patience.count() / 1000, " s: ", resp.status().message()));
    }
    if (!pacer.unreachable()) {
      spdlog::warn("{}; retrying for up to {} s", std::string(resp.status().message()), opts_.patience.count() / 1000);
    }
    if (int sig = wait_(-1, pacer.Unreachable()); sig > 0) {
      *signal = sig;
      return absl::CancelledError(absl::StrCat("stopped by ", SignalName(sig)));
    }
  }
}

}  // namespace launch
