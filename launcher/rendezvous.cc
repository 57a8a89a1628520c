#include "launcher/rendezvous.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace launch {

const char* PhaseName(Rendezvous::Phase p) {
  switch (p) {
    case Rendezvous::Phase::kWaiting: return "waiting";
    case Rendezvous::Phase::kRunning: return "running";
    case Rendezvous::Phase::kSucceeded: return "succeeded";
    case Rendezvous::Phase::kFailed: return "failed";
  }
  return "?";
}

Rendezvous::Rendezvous(std::string run_id, RendezvousConfig config, const Clock* clock)
    : run_id_(std::move(run_id)), config_(config), clock_(clock) {}

absl::Status Rendezvous::Join(const v1::JoinRequest& req) {
  const std::string& id = req.node().node_id();
  if (id.empty()) return absl::InvalidArgumentError("join without a node id");
  if (req.node().local_world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", id, " joined with local_world_size ", req.node().local_world_size()));
  }
  if (phase_ == Phase::kSucceeded || phase_ == Phase::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("run '", run_id_, "' has ended (", PhaseName(phase_), ")"));
  }
  if (phase_ == Phase::kRunning) {
    // A node (new, or back after a restart of its own) asks in while a round runs: the next round
    // takes it, the running nodes learn of it from their heartbeats. No restart budget is spent.
    OpenNextRound();
  }
  for (auto& m : waiting_) {
    if (m.join.node().node_id() == id) {  // a retry: refresh what it offers
      m.join = req;
      m.last_seen = clock_->Now();
      return absl::OkStatus();
    }
  }
  if (static_cast<int>(waiting_.size()) >= config_.max_nodes) {
    return absl::ResourceExhaustedError(absl::StrCat("run '", run_id_, "' already has its ",
                                                     config_.max_nodes, " node(s) (--nnodes max)"));
  }
  waiting_.push_back({req, clock_->Now()});
  if (static_cast<int>(waiting_.size()) >= config_.min_nodes && !last_call_deadline_) {
    last_call_deadline_ = clock_->Now() + config_.last_call_timeout;
  }
  if (static_cast<int>(waiting_.size()) == config_.max_nodes) FormRound();
  return absl::OkStatus();
}

void Rendezvous::OpenNextRound() {
  if (phase_ == Phase::kWaiting) return;
  phase_ = Phase::kWaiting;
  waiting_.clear();
  last_call_deadline_.reset();
  succeeded_.clear();
}

void Rendezvous::FormRound() {
  // Stable group ranks: survivors keep their order from the last round; newcomers follow.
  std::vector<const Member*> order;
  for (const auto& id : members_) {
    for (const auto& m : waiting_)
      if (m.join.node().node_id() == id) order.push_back(&m);
  }
  for (const auto& m : waiting_) {
    if (std::find(order.begin(), order.end(), &m) == order.end()) order.push_back(&m);
  }
  ++round_;
  members_.clear();
  assignments_.clear();
  int world = 0;
  for (const auto* m : order) world += m->join.node().local_world_size();
  const v1::JoinRequest& host = order.front()->join;
  int offset = 0;
  for (size_t r = 0; r < order.size(); ++r) {
    const v1::JoinRequest& j = order[r]->join;
    v1::Assignment a;
    a.set_round(round_);
    a.set_group_rank(static_cast<int>(r));
    a.set_group_world_size(static_cast<int>(order.size()));
    a.set_world_size(world);
    a.set_rank_offset(offset);
    a.set_master_addr(host.proposed_master_addr());
    a.set_master_port(host.proposed_master_port());
    a.set_restart_count(restart_count_);
    a.set_max_restarts(config_.max_restarts);
    offset += j.node().local_world_size();
    const std::string& id = j.node().node_id();
    members_.push_back(id);
    assignments_[id] = a;
    identities_[id] = j.node();
    last_seen_[id] = order[r]->last_seen;
  }
  waiting_.clear();
  last_call_deadline_.reset();
  phase_ = Phase::kRunning;
}

std::optional<v1::Assignment> Rendezvous::AssignmentFor(const std::string& node_id,
                                                        long last_round) const {
  if (phase_ != Phase::kRunning || round_ <= last_round) return std::nullopt;
  auto it = assignments_.find(node_id);
  if (it == assignments_.end()) return std::nullopt;
  return it->second;
}

std::optional<Clock::TimePoint> Rendezvous::Tick() {
  if (phase_ != Phase::kWaiting || !last_call_deadline_) return std::nullopt;
  if (clock_->Now() >= *last_call_deadline_) {
    FormRound();
    return std::nullopt;
  }
  return last_call_deadline_;
}

v1::HeartbeatResponse Rendezvous::Heartbeat(const v1::HeartbeatRequest& req) {
  last_seen_[req.node_id()] = clock_->Now();
  v1::HeartbeatResponse resp;
  long current = phase_ == Phase::kWaiting ? round_ + 1 : round_;
  resp.set_current_round(current);
  resp.set_stop_workers(phase_ == Phase::kFailed || current > req.round());
  return resp;
}

v1::ReportExitResponse Rendezvous::ReportExit(const v1::ReportExitRequest& req) {
  v1::ReportExitResponse resp;
  if (req.round() == round_ && phase_ == Phase::kRunning) {
    if (req.group_succeeded()) {
      succeeded_[req.node_id()] = true;
      if (succeeded_.size() == members_.size()) phase_ = Phase::kSucceeded;
    } else {
      if (!first_failure_ && req.exits_size() > 0) first_failure_ = req.exits(0);
      if (restart_count_ < config_.max_restarts) {
        ++restart_count_;
        OpenNextRound();
      } else {
        phase_ = Phase::kFailed;
      }
    }
  }
  // A node stopped because of another node's failure learns whether a new round is coming.
  resp.set_restart(phase_ == Phase::kWaiting);
  resp.set_restart_count(restart_count_);
  return resp;
}

v1::StatusResponse Rendezvous::Status() const {
  v1::StatusResponse s;
  s.set_run_id(run_id_);
  s.set_round(round_);
  s.set_state(PhaseName(phase_));
  s.set_restart_count(restart_count_);
  s.set_max_restarts(config_.max_restarts);
  for (size_t r = 0; r < members_.size(); ++r) {
    auto* n = s.add_nodes();
    *n->mutable_node() = identities_.at(members_[r]);
    n->set_group_rank(static_cast<int>(r));
    auto seen = last_seen_.find(members_[r]);
    if (seen != last_seen_.end()) n->set_seconds_since_heartbeat(SecondsBetween(seen->second, clock_->Now()));
  }
  if (first_failure_) *s.mutable_first_failure() = *first_failure_;
  return s;
}

}  // namespace launch
