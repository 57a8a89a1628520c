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

absl::Status ValidateAssignment(const v1::Assignment& a, int local_world_size) {
  auto bad = [](const std::string& field, const auto& value, const std::string& expected) {
    return absl::FailedPreconditionError(
        absl::StrCat("the coordinator's assignment has ", field, " ", value, "; expected ", expected));
  };
  if (a.round() < 1 || a.round() > kMaxRound) return bad("round", a.round(), absl::StrCat("1..", kMaxRound));
  if (a.group_world_size() < 1 || a.group_world_size() > kMaxNodes) {
    return bad("group_world_size", a.group_world_size(), absl::StrCat("1..", kMaxNodes, " nodes"));
  }
  if (a.group_rank() < 0 || a.group_rank() >= a.group_world_size()) {
    return bad("group_rank", a.group_rank(), absl::StrCat("0..", a.group_world_size() - 1));
  }
  const int64_t max_world = static_cast<int64_t>(a.group_world_size()) * kMaxWorkersPerNode;
  if (a.world_size() < local_world_size || a.world_size() > max_world) {
    return bad("world_size", a.world_size(),
               absl::StrCat(local_world_size, "..", max_world, " (this node has ", local_world_size, " ranks)"));
  }
  // int64: rank_offset + local_world_size must not overflow on the way to RANK.
  if (a.rank_offset() < 0 || static_cast<int64_t>(a.rank_offset()) + local_world_size > a.world_size()) {
    return bad("rank_offset", a.rank_offset(),
               absl::StrCat("0..", a.world_size() - local_world_size, " (", local_world_size,
                            " ranks on this node in a world of ", a.world_size(), ")"));
  }
  if (a.master_addr().empty() || a.master_addr().size() > kMaxHostLength) {
    return bad("a master_addr of", a.master_addr().size(), absl::StrCat("1..", kMaxHostLength, " bytes"));
  }
  if (a.master_port() < 1 || a.master_port() > 65535) return bad("master_port", a.master_port(), "1..65535");
  if (a.max_restarts() < 0) return bad("max_restarts", a.max_restarts(), "0 or more");
  if (a.restart_count() < 0 || a.restart_count() > a.max_restarts()) {
    return bad("restart_count", a.restart_count(), absl::StrCat("0..", a.max_restarts(), " (max_restarts)"));
  }
  if (a.lease_port() < 0 || a.lease_port() > 65535) return bad("lease_port", a.lease_port(), "0..65535");
  if (a.coordinator_host().size() > kMaxHostLength + kMaxAddressLength + 3) {
    return bad("a coordinator_host of", a.coordinator_host().size(), "a host name and address");
  }
  // Each node's interface addresses and its host address.
  const int64_t max_addresses = static_cast<int64_t>(a.group_world_size()) * (kMaxNodeAddresses + 1);
  if (a.member_addresses_size() > max_addresses) {
    return bad("member_addresses:", a.member_addresses_size(), absl::StrCat("at most ", max_addresses));
  }
  for (const std::string& address : a.member_addresses()) {
    if (address.size() > kMaxAddressLength) {
      return bad("a member address of", address.size(), absl::StrCat("at most ", kMaxAddressLength, " bytes"));
    }
  }
  return absl::OkStatus();
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
    if (result.ok()) {
      // Wire input: a coordinator's numbers are checked before they size or name anything.
      if (absl::Status valid = ValidateAssignment(*result, opts_.node.local_world_size()); !valid.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(client_->target(), ": ", valid.message()));
      }
      client_->SetNodeKey(result->lease_key());
      return result;
    }
    if (!CoordinatorUnreachable(result.status()) || clock_->Now() >= deadline) return result;
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
