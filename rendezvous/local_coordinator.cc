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

std::string Prefixed(const std::string& what, const absl::Status& st) {
  return absl::StrCat(what, " in-process: ", st.message());
}

}  // namespace

// A watch in process: registered with the coordinator until answered or destroyed.
class LocalCoordinator::Watcher final : public InProcessWatch {
 public:
  Watcher(LocalCoordinator* c, v1::HeartbeatRequest beat, std::function<void(const v1::HeartbeatResponse&)> answered)
      : c_(c), beat_(std::move(beat)), answered_(std::move(answered)) {}
  ~Watcher() override {
    std::lock_guard<std::mutex> lock(c_->mu_);
    UnregisterLocked();
  }
  const v1::HeartbeatRequest& beat() const { return beat_; }

  // c_->mu_ held. Answers once, and leaves the coordinator's list.
  void AnswerLocked(const v1::HeartbeatResponse& ans) {
    if (done_) return;
    done_ = true;
    UnregisterLocked();
    if (c_->rdzv_ && (ans.job_succeeded() || ans.job_failed())) c_->rdzv_->NoteToldEnd(beat_.node_id());
    answered_(ans);
  }

 private:
  void UnregisterLocked() {
    auto& w = c_->watchers_;
    w.erase(std::remove(w.begin(), w.end(), this), w.end());
  }

  LocalCoordinator* const c_;
  const v1::HeartbeatRequest beat_;  // a renewal: the registration without what only the first one carries
  const std::function<void(const v1::HeartbeatResponse&)> answered_;
  bool done_ = false;  // under c_->mu_
};

LocalCoordinator::LocalCoordinator(RendezvousConfig defaults, const Clock* clock)
    : defaults_(std::move(defaults)), clock_(clock) {}

LocalCoordinator::~LocalCoordinator() = default;

Rendezvous* LocalCoordinator::RunLocked(const std::string& run_id, absl::Status* error) {
  if (rdzv_ && run_id == run_id_) return rdzv_.get();
  *error = absl::NotFoundError(absl::StrCat("no run '", run_id, "' on this coordinator (unknown, or closed)"));
  return nullptr;
}

void LocalCoordinator::TickLocked() {
  if (!rdzv_) return;
  // A node watched in this process lives as long as the process: its lease is renewed before the
  // state machine looks at leases, however long since the last call, so a stopped or paused
  // process costs it nothing and no pause needs forgiving.
  for (Watcher* w : watchers_) (void)rdzv_->Heartbeat(w->beat());
  if (!next_tick_ || *next_tick_ <= clock_->Now()) next_tick_ = rdzv_->Tick();
  // Answering removes a watcher from the list: walk a copy.
  const std::vector<Watcher*> watching = watchers_;
  for (Watcher* w : watching) {
    v1::HeartbeatResponse ans = rdzv_->HeartbeatAnswer(w->beat());
    if (Rendezvous::Urgent(ans)) w->AnswerLocked(ans);
  }
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
  // The monitor's samples are the calls a quiet single-node run gets: its timers are looked at.
  ChangedLocked(r->version());
  v1::SampleResponse resp;
  for (v1::StragglerEvent& e : view_->EventsAfter(req.events_seen())) *resp.add_events() = std::move(e);
  return resp;
}

namespace {
// The stream a client without one answers with: ended at once, saying what to use instead.
class NoStream final : public WatchStream {
 public:
  bool Send(const v1::HeartbeatRequest&) override { return false; }
  bool Receive(v1::HeartbeatResponse*) override { return false; }
  absl::Status Finish() override {
    return absl::FailedPreconditionError("watch in-process: this coordinator is watched with WatchInProcess");
  }
  void Cancel() override {}
};
}  // namespace

std::unique_ptr<WatchStream> LocalCoordinator::Watch() { return std::make_unique<NoStream>(); }

std::unique_ptr<InProcessWatch> LocalCoordinator::WatchInProcess(
    const v1::HeartbeatRequest& registration, std::function<void(const v1::HeartbeatResponse&)> answered) {
  v1::HeartbeatRequest beat = registration;
  beat.clear_node();
  beat.clear_assignment();
  beat.clear_spec();
  auto w = std::make_unique<Watcher>(this, std::move(beat), std::move(answered));
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status error;
  Rendezvous* r = RunLocked(registration.run_id(), &error);
  if (r == nullptr) {
    // Not for a restarted coordinator to learn again, as on a stream: this one is in this process.
    v1::HeartbeatResponse refused;
    refused.set_stop_workers(true);
    refused.set_job_failed(true);
    refused.set_reason(Prefixed("watch", error));
    w->AnswerLocked(refused);
    return w;
  }
  const uint64_t v = r->version();
  v1::HeartbeatResponse ans = r->Heartbeat(registration);
  if (Rendezvous::Urgent(ans)) {
    w->AnswerLocked(ans);
  } else {
    watchers_.push_back(w.get());
  }
  ChangedLocked(v);
  return w;
}

}  // namespace launch
