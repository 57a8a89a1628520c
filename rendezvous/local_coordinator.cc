#include "rendezvous/local_coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace launch {
namespace {

// How often a join still waiting for its round looks whether it was cancelled: CallCanceller
// wakes gRPC calls only. A single node's round forms at its join, so this wait is the rare case
// (a spec whose round cannot form).
constexpr std::chrono::milliseconds kCancelCheck{100};
// How much later than the stream's own period a heartbeat may come before the gap counts as time
// the process did not run (the gRPC coordinator's tolerance for its timer).
constexpr std::chrono::milliseconds kPauseTolerance{1000};

std::string Prefixed(const std::string& what, const absl::Status& st) {
  return absl::StrCat(what, " in-process: ", st.message());
}

}  // namespace

// One Watch stream: the heartbeats it sends renew the lease; Receive returns the first answer
// the node must act on, whenever the run changes so that it must.
class LocalCoordinator::Stream final : public WatchStream {
 public:
  explicit Stream(LocalCoordinator* c) : c_(c) {}

  bool Send(const v1::HeartbeatRequest& hb) override {
    std::lock_guard<std::mutex> lock(c_->mu_);
    if (cancelled_ || answered_) return !cancelled_;
    absl::Status error;
    Rendezvous* r = c_->RunLocked(hb.run_id(), &error);
    v1::HeartbeatResponse ans;
    const Clock::TimePoint now = c_->clock_->Now();
    if (r == nullptr) {
      ans.set_unknown_node(true);
    } else {
      // Heartbeats much further apart than the agent sends them: the whole process did not run
      // (SIGSTOP, a paused VM), as the gRPC coordinator's timer found; that time counts against
      // no lease.
      if (last_sent_ && now - *last_sent_ > c_->heartbeat_interval_ + kPauseTolerance) {
        const Clock::Duration paused = now - *last_sent_ - c_->heartbeat_interval_;
        spdlog::warn("the coordinator did not run for {:.1f} s (stopped or paused): every lease is extended by that",
                     std::chrono::duration<double>(paused).count());
        r->ForgivePause(paused);
      }
      const uint64_t v = r->version();
      ans = r->Heartbeat(hb);
      c_->ChangedLocked(v);
    }
    last_ = hb;
    has_last_ = true;
    last_sent_ = now;
    if (r == nullptr || Rendezvous::Urgent(ans)) AnswerLocked(ans);
    c_->changed_.notify_all();
    return true;
  }

  bool Receive(v1::HeartbeatResponse* resp) override {
    std::unique_lock<std::mutex> lock(c_->mu_);
    c_->changed_.wait(lock, [&] {
      if (cancelled_ || answered_) return true;
      if (!has_last_ || !c_->rdzv_) return false;
      v1::HeartbeatResponse ans = c_->rdzv_->HeartbeatAnswer(last_);
      if (!Rendezvous::Urgent(ans)) return false;
      AnswerLocked(ans);
      return true;
    });
    if (!answered_) return false;
    *resp = answer_;
    return true;
  }

  absl::Status Finish() override { return absl::CancelledError("watch in-process: cancelled"); }

  void Cancel() override {
    std::lock_guard<std::mutex> lock(c_->mu_);
    cancelled_ = true;
    c_->changed_.notify_all();
  }

 private:
  // mu_ held.
  void AnswerLocked(const v1::HeartbeatResponse& ans) {
    if (answered_) return;
    answered_ = true;
    answer_ = ans;
    if (c_->rdzv_ && (ans.job_succeeded() || ans.job_failed())) c_->rdzv_->NoteToldEnd(last_.node_id());
  }

  LocalCoordinator* const c_;
  // Under c_->mu_.
  bool cancelled_ = false;
  bool answered_ = false;
  bool has_last_ = false;
  std::optional<Clock::TimePoint> last_sent_;
  v1::HeartbeatRequest last_;
  v1::HeartbeatResponse answer_;
};

LocalCoordinator::LocalCoordinator(RendezvousConfig defaults, std::chrono::milliseconds heartbeat_interval,
                                   const Clock* clock)
    : defaults_(std::move(defaults)), heartbeat_interval_(heartbeat_interval), clock_(clock) {}

LocalCoordinator::~LocalCoordinator() = default;

Rendezvous* LocalCoordinator::RunLocked(const std::string& run_id, absl::Status* error) {
  if (rdzv_ && run_id == run_id_) return rdzv_.get();
  *error = absl::NotFoundError(absl::StrCat("no run '", run_id, "' on this coordinator (unknown, or closed)"));
  return nullptr;
}

void LocalCoordinator::TickLocked() {
  if (rdzv_ && (!next_tick_ || *next_tick_ <= clock_->Now())) next_tick_ = rdzv_->Tick();
}

void LocalCoordinator::ChangedLocked(uint64_t version_before) {
  TickLocked();
  if (rdzv_->version() != version_before) changed_.notify_all();
}

absl::StatusOr<v1::Assignment> LocalCoordinator::Join(const v1::JoinRequest& req, CallCanceller* cancel) {
  std::unique_lock<std::mutex> lock(mu_);
  return *JoinLocked(lock, req, cancel, true);
}

std::optional<absl::StatusOr<v1::Assignment>> LocalCoordinator::JoinAtOnce(const v1::JoinRequest& req) {
  std::unique_lock<std::mutex> lock(mu_);
  return JoinLocked(lock, req, nullptr, false);
}

std::optional<absl::StatusOr<v1::Assignment>> LocalCoordinator::JoinLocked(std::unique_lock<std::mutex>& lock,
                                                                           const v1::JoinRequest& req,
                                                                           CallCanceller* cancel, bool wait) {
  const std::string what = "rendezvous join at";
  if (!rdzv_) {
    RendezvousConfig cfg = defaults_;
    if (req.has_spec()) {
      auto c = RendezvousConfig::FromSpec(req.spec());
      if (!c.ok()) return absl::Status(c.status().code(), Prefixed(what, c.status()));
      cfg = *c;
    }
    run_id_ = req.run_id();
    rdzv_ = std::make_unique<Rendezvous>(run_id_, cfg, clock_);
    view_ = std::make_unique<JobView>(cfg.straggler_factor);
    spdlog::info("run '{}': first node {} ({})", run_id_, req.node().hostname(), req.node().node_id());
  } else if (req.run_id() != run_id_) {
    return absl::FailedPreconditionError(
        Prefixed(what, absl::InvalidArgumentError(absl::StrCat("this coordinator runs '", run_id_, "' only"))));
  }
  const std::string& id = req.node().node_id();
  // The retry of a join that JoinAtOnce left waiting, whose round has formed since: joining again
  // now would open the next round.
  if (waiting_join_ == id) {
    waiting_join_.clear();
    if (auto a = rdzv_->AssignmentFor(id, req.last_round())) return *a;
  }
  const uint64_t v = rdzv_->version();
  next_tick_.reset();
  if (absl::Status st = rdzv_->Join(req); !st.ok()) return absl::Status(st.code(), Prefixed(what, st));
  ChangedLocked(v);
  const Clock::TimePoint deadline = clock_->Now() + rdzv_->config().join_timeout + std::chrono::seconds(2);
  for (;;) {
    if (auto a = rdzv_->AssignmentFor(id, req.last_round())) return *a;
    if (auto refused = rdzv_->TakeJoinRefusal(id)) return absl::Status(refused->code(), Prefixed(what, *refused));
    if (rdzv_->ended()) {
      return absl::FailedPreconditionError(
          Prefixed(what, absl::UnknownError(absl::StrCat("run '", run_id_, "' ", PhaseName(rdzv_->phase()),
                                                         rdzv_->reason().empty() ? "" : ": ", rdzv_->reason()))));
    }
    if (!wait) {  // the node waits in the round; Join takes it as a retry
      waiting_join_ = id;
      return std::nullopt;
    }
    const Clock::TimePoint now = clock_->Now();
    if ((cancel && cancel->cancelled()) || now >= deadline) {
      const uint64_t before = rdzv_->version();
      rdzv_->CancelJoin(id);
      next_tick_.reset();
      ChangedLocked(before);
      if (now >= deadline) return absl::DeadlineExceededError(absl::StrCat(what, " in-process: no answer in time"));
      return absl::CancelledError("join cancelled");
    }
    Clock::TimePoint wake = std::min(deadline, now + kCancelCheck);
    if (next_tick_) wake = std::min(wake, *next_tick_);
    // The state machine's time is the Clock's; the wait itself is real time for what is left.
    changed_.wait_for(lock, std::max(wake - now, Clock::Duration::zero()));
    TickLocked();
  }
}

absl::StatusOr<v1::HeartbeatResponse> LocalCoordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status error;
  Rendezvous* r = RunLocked(req.run_id(), &error);
  v1::HeartbeatResponse ans;
  if (r == nullptr) {
    ans.set_unknown_node(true);
    return ans;
  }
  const uint64_t v = r->version();
  ans = r->Heartbeat(req);
  ChangedLocked(v);
  if (Rendezvous::Urgent(ans) && (ans.job_succeeded() || ans.job_failed())) r->NoteToldEnd(req.node_id());
  return ans;
}

absl::StatusOr<v1::ReportExitResponse> LocalCoordinator::ReportExit(const v1::ReportExitRequest& req,
                                                                    std::chrono::milliseconds) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status error;
  Rendezvous* r = RunLocked(req.run_id(), &error);
  if (r == nullptr) return absl::Status(error.code(), Prefixed("exit report to", error));
  const uint64_t v = r->version();
  v1::ReportExitResponse resp = r->ReportExit(req);
  for (const v1::WorkerExit& e : req.exits())
    if (e.hung()) view_->NoteHung(req.round(), e.rank());
  if (resp.job_succeeded() || resp.job_failed()) r->NoteToldEnd(req.node_id());
  next_tick_.reset();
  if (r->version() != v && !r->reason().empty()) spdlog::info("run '{}': {}", run_id_, r->reason());
  ChangedLocked(v);
  return resp;
}

absl::StatusOr<v1::SampleResponse> LocalCoordinator::Sample(const v1::SampleRequest& req, std::chrono::milliseconds) {
  if (absl::Status valid = ValidateSample(req); !valid.ok()) return valid;
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status error;
  Rendezvous* r = RunLocked(req.run_id(), &error);
  if (r == nullptr) return error;
  if (!r->IsMember(req.node_id()) || req.round() > r->round()) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", req.node_id(), " is not in round ", req.round(), " of run '", run_id_, "'"));
  }
  view_->Update(req, clock_->Now());
  v1::SampleResponse resp;
  for (v1::StragglerEvent& e : view_->EventsAfter(req.events_seen())) *resp.add_events() = std::move(e);
  return resp;
}

std::unique_ptr<WatchStream> LocalCoordinator::Watch() { return std::make_unique<Stream>(this); }

}  // namespace launch
