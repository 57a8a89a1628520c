#include "rendezvous/coordinator.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rendezvous/grpc_wire.h"
#include "common/limits.h"
#include "common/launch_env.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "common/tunables.h"
#include "rendezvous/grpc_log.h"
#include "spdlog/spdlog.h"
#include "common/thread_name.h"

namespace launch {

namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

bool ValidId(const std::string& s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 127; });
}

absl::Status ValidateIds(const std::string& run_id, const std::string& node_id) {
  if (!ValidId(run_id, kMaxRunIdLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat("run id missing, over ", kMaxRunIdLength, " bytes or not printable"));
  }
  if (!ValidId(node_id, kMaxNodeIdLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat("node id missing, over ", kMaxNodeIdLength, " bytes or not printable"));
  }
  return absl::OkStatus();
}

absl::Status ValidateNode(const std::string& run_id, const v1::NodeIdentity& n) {
  if (absl::Status st = ValidateIds(run_id, n.node_id()); !st.ok()) return st;
  if (n.local_world_size() < 1 || n.local_world_size() > kMaxWorkersPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("node ", Shown(n.node_id()), ": local_world_size ",
                                                   n.local_world_size(), " is not 1-", kMaxWorkersPerNode));
  }
  if (n.host_address().size() > kMaxHostLength || n.hostname().size() > kMaxHostLength) {
    return absl::InvalidArgumentError(absl::StrCat("host name or address over ", kMaxHostLength, " bytes"));
  }
  if (n.addresses_size() > kMaxNodeAddresses) {
    return absl::InvalidArgumentError(absl::StrCat("node ", Shown(n.node_id()), ": ", n.addresses_size(),
                                                   " interface addresses (expected at most ", kMaxNodeAddresses, ")"));
  }
  for (const auto& a : n.addresses()) {
    if (!ValidId(a, kMaxAddressLength)) {
      return absl::InvalidArgumentError(absl::StrCat("node ", Shown(n.node_id()),
                                                     ": an interface address missing, over ", kMaxAddressLength,
                                                     " bytes or not printable"));
    }
  }
  return absl::OkStatus();
}

// What a joining node offers as MASTER_ADDR/MASTER_PORT reaches every worker of the job.
absl::Status ValidateJoin(const v1::JoinRequest& req) {
  if (absl::Status st = ValidateNode(req.run_id(), req.node()); !st.ok()) return st;
  if (!ValidId(req.proposed_master_addr(), kMaxHostLength)) {
    return absl::InvalidArgumentError(
        absl::StrCat("proposed master address missing, over ", kMaxHostLength, " bytes or not printable"));
  }
  if (req.proposed_master_port() < 1 || req.proposed_master_port() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("proposed master port ", req.proposed_master_port(), ": expected 1-65535"));
  }
  return absl::OkStatus();
}

// A message over the rendezvous limit is refused with a log line naming the peer. (gRPC itself
// refuses those over kGrpcReceiveLimitBytes before they are parsed.)
grpc::Status CheckSize(const std::string& peer, const google::protobuf::Message& m, const char* rpc,
                       std::string* log_line) {
  const size_t n = m.ByteSizeLong();
  if (n <= static_cast<size_t>(kMaxRendezvousMessageBytes)) return grpc::Status::OK;
  *log_line = absl::StrCat("rejected ", rpc, " from ", peer, ": a message of ", n, " bytes (limit ",
                           kMaxRendezvousMessageBytes, ")");
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("a message of ", n, " bytes is over the rendezvous limit of ",
                                   kMaxRendezvousMessageBytes, " bytes"));
}

// The node key a caller presented (empty: none).
std::string PresentedNodeKey(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kNodeKeyMetadataKey);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

// A key a node presents against the one it must have (a lease key: kLeaseKeyBytes bytes).
bool KeyMatches(const std::string& presented, const std::string& expected) {
  return expected.size() == kLeaseKeyBytes && ConstantTimeEquals(presented, expected);
}

absl::Status WrongNodeKey(const std::string& node_id, bool presented) {
  return absl::PermissionDeniedError(absl::StrCat(presented ? "wrong" : "no", " node key (", kNodeKeyMetadataKey,
                                                  ") for node ", Shown(node_id),
                                                  ": a node speaks only for itself, with the key of its join"));
}

}  // namespace

// A Join whose answer comes when its round forms; it owns nothing but its place in the run.
class CoordinatorService::HeldCall final : public grpc::ServerUnaryReactor {
 public:
  HeldCall(CoordinatorService* svc, const v1::JoinRequest* req, v1::JoinResponse* resp, std::string peer)
      : svc_(svc), run_id(req->run_id()), peer(std::move(peer)), join_req(req), join_resp(resp) {}
  void OnCancel() override { svc_->Cancelled(this); }
  void OnDone() override { delete this; }

  CoordinatorService* svc_;
  const std::string run_id;
  const std::string peer;
  const v1::JoinRequest* const join_req;
  v1::JoinResponse* const join_resp;
};

// One agent's Watch stream: every message it reads renews the node's lease; it writes once, when
// the node must act (stop its workers, the run ended, the node is unknown), and finishes with it.
// Every decision to finish is taken under the service's mu_, so exactly one Finish happens; the
// Finish itself comes after mu_ is released (Finishes).
class CoordinatorService::WatchReactor final
    : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  WatchReactor(CoordinatorService* svc, grpc::CallbackServerContext* ctx)
      : svc_(svc), peer_(ctx->peer()), node_key_(PresentedNodeKey(ctx)) {
    grpc::Status st = svc_->CheckToken(ctx, "Watch");
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(svc_->mu_);
      if (svc_->standby_) st = svc_->NotLeaderLocked();
    }
    if (!st.ok()) {
      finished_ = true;  // not yet known to anyone else: no lock needed
      Finish(st);
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    Finishes f;
    {
      std::lock_guard<std::mutex> lock(svc_->mu_);
      if (!finished_) ReadDoneLocked(ok, &f);
    }
    svc_->FinishAll(f);
    svc_->settled_.notify_all();
  }

  // mu_ held: a change in the run may be this node's business.
  void PumpLocked(Finishes* f) {
    if (finished_) return;
    v1::HeartbeatResponse ans = run_->rdzv->HeartbeatAnswer(last_);
    if (!Rendezvous::Urgent(ans)) return;
    if (EndsTheJob(OrderOf(ans))) run_->rdzv->NoteToldEnd(last_.node_id());
    AnswerLocked(ans, f);
  }
  // mu_ held: the service shuts down.
  void ShutdownLocked(Finishes* f) {
    FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"), f);
  }
  // mu_ held: this replica stands by now.
  void EndLocked(grpc::Status st, Finishes* f) { FinishLocked(std::move(st), f); }
  // mu_ not held: carries out the decision (once; only the decider's Finishes holds this stream).
  void FinishAsDecided() {
    if (answer_) StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
    else Finish(final_);
  }
  // mu_ not held: the decision stands, but its answer could not be kept (the store refused it):
  // the stream ends with `st` instead (only the decider's Finishes holds this stream).
  void FailAsDecided(const grpc::Status& st) {
    answer_ = false;
    final_ = st;
    FinishAsDecided();
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(svc_->mu_);
      // By id: a replica that stood by since has forgotten the run this stream was in.
      if (run_ != nullptr) {
        if (auto it = svc_->runs_.find(run_id_); it != svc_->runs_.end()) it->second.watchers.erase(this);
      }
    }
    delete this;
  }

 private:
  // One message read (or the reading ended); mu_ held. Each path ends the stream or reads on.
  void ReadDoneLocked(bool ok, Finishes* f) {
    if (!ok) return FinishLocked(grpc::Status::OK, f);  // the agent closed the stream, or the call broke
    if (svc_->stopping_) {
      return FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"), f);
    }
    if (svc_->standby_) return FinishLocked(svc_->NotLeaderLocked(), f);
    std::string why;
    if (grpc::Status big = CheckSize(peer_, in_, "Watch", &why); !big.ok()) {
      f->Warn(why);
      return FinishLocked(big, f);
    }
    if (run_ == nullptr) run_id_ = in_.run_id();
    if (in_.run_id() != run_id_) {
      return FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "one Watch stream watches one run"), f);
    }
    last_ = in_;
    v1::HeartbeatResponse ans;
    auto run = svc_->HeartbeatLocked(peer_, node_key_, last_, &ans, f);
    if (finished_) return;  // answered already: the change this heartbeat made was this node's business
    if (!run.ok()) return FinishLocked(ToGrpc(run.status()), f);
    if (*run == nullptr || Rendezvous::Urgent(ans)) return AnswerLocked(ans, f);
    if (run_ == nullptr) {
      run_ = *run;
      run_->watchers.insert(this);
    }
    if (last_.lease_by_udp() && ++messages_ >= 3 && !run_->udp_seen.count(last_.node_id())) {
      // Its datagrams do not get here (a firewall, another port): the stream must do.
      f->Warn(absl::StrCat("run '", Shown(run_id_), "': no lease datagram from node ", Shown(last_.node_id()), " (",
                           peer_, ") has arrived; it heartbeats on its stream"));
      ans.set_lease_by_stream(true);
      return AnswerLocked(ans, f);
    }
    // Under mu_, unlike a finish: OnDone (which takes mu_) cannot run while a read is started.
    StartRead(&in_);
  }

  void AnswerLocked(const v1::HeartbeatResponse& ans, Finishes* f) {
    if (finished_) return;
    finished_ = true;
    out_ = ans;
    answer_ = true;
    f->streams.push_back(this);
  }
  void FinishLocked(grpc::Status st, Finishes* f) {
    if (finished_) return;
    finished_ = true;
    final_ = std::move(st);
    f->streams.push_back(this);
  }

  CoordinatorService* svc_;
  const std::string peer_;
  const std::string node_key_;
  std::string run_id_;
  Run* run_ = nullptr;     // set once the node is known; a run with watchers is never removed
  bool finished_ = false;  // under svc_->mu_
  bool answer_ = false;    // the decision: write out_ and finish OK, or finish with final_
  grpc::Status final_;
  int messages_ = 0;  // read with lease_by_udp
  v1::HeartbeatRequest in_, last_;
  v1::HeartbeatResponse out_;
};

CoordinatorService::CoordinatorService(CoordinatorOptions opts, const Clock* clock)
    : opts_(std::move(opts)), clock_(clock) {}

CoordinatorService::~CoordinatorService() { Shutdown(); }

void CoordinatorService::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!timer_.joinable()) {
    timer_ = std::thread([this] {
      NameThisThread("launch-rdzvtime");
      TimerLoop();
    });
  }
}

void CoordinatorService::Shutdown() {
  Finishes f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !timer_.joinable()) return;
    stopping_ = true;
    for (auto& [id, run] : runs_) {
      for (HeldCall* c : run.held)
        f.emplace_back(c, grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
      run.held.clear();
      for (WatchReactor* w : run.watchers) w->ShutdownLocked(&f);
    }
    wake_.notify_all();
  }
  FinishAll(f);
  if (timer_.joinable()) timer_.join();
}

bool CoordinatorService::WaitUntilEveryNodeKnowsTheEnd(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return settled_.wait_for(lock, timeout, [&] {
    for (const auto& [id, run] : runs_)
      if (!run.rdzv->EveryoneToldEnd()) return false;
    return true;
  });
}

int CoordinatorService::runs_for_test() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(runs_.size());
}

bool CoordinatorService::FinishAll(Finishes& f) {
  bool kept = true;
  if (store_ != nullptr && (!f.records.empty() || !f.removed.empty())) {
    std::lock_guard<std::mutex> lock(store_mu_);
    std::vector<v1::RunRecord> changed;
    for (v1::RunRecord& r : f.records) {
      // A record whose run is not whole (rebuilt from re-registrations) or that a later one
      // already replaced is not written.
      if (r.run_id().empty()) continue;
      auto it = stored_version_.find(r.run_id());
      if (it != stored_version_.end() && it->second >= r.version()) continue;
      changed.push_back(std::move(r));
    }
    if (!changed.empty() || !f.removed.empty()) {
      absl::Status st = store_->Save(changed, f.removed);
      if (st.ok()) {
        for (const auto& r : changed) stored_version_[r.run_id()] = r.version();
        for (const auto& id : f.removed) stored_version_.erase(id);
      } else {
        kept = false;
        f.Warn(absl::StrCat("could not keep the runs' state (", st.message(), "): answering UNAVAILABLE"));
      }
    }
  }
  const grpc::Status lost(
      grpc::StatusCode::UNAVAILABLE,
      "this coordinator replica could not keep the run's state in etcd; retry (another replica leads)");
  for (const auto& [warning, line] : f.logs) {
    if (warning) spdlog::warn("{}", line);
    else spdlog::info("{}", line);
  }
  for (auto& [call, status] : f.calls) call->Finish(kept || !status.ok() ? status : lost);
  for (WatchReactor* w : f.streams) {
    if (kept) w->FinishAsDecided();
    else w->FailAsDecided(lost);
  }
  f = Finishes();
  return kept;
}

grpc::Status CoordinatorService::NotLeaderLocked() const {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      leader_.empty() ? "this coordinator replica stands by; no replica leads yet"
                                      : absl::StrCat("this coordinator replica stands by; the leader is at ", leader_));
}

void CoordinatorService::set_store(RunStore* store) {
  std::lock_guard<std::mutex> lock(mu_);
  store_ = store;
  standby_ = store != nullptr;
}

std::optional<v1::ReplicaStatus> CoordinatorService::Replica() {
  RunStore* store;
  {
    std::lock_guard<std::mutex> lock(mu_);
    store = store_;
  }
  if (store == nullptr) return std::nullopt;
  return store->Describe();
}

bool CoordinatorService::leading() {
  std::lock_guard<std::mutex> lock(mu_);
  return !standby_;
}

v1::RunRecord CoordinatorService::RecordOf(const Run& run) {
  v1::RunRecord r = run.rdzv->ToRecord();
  if (r.run_id().empty()) return r;
  r.set_lease_key(run.lease_key);
  for (v1::MemberRecord& m : *r.mutable_members()) {
    if (auto it = run.node_keys.find(m.node().node_id()); it != run.node_keys.end()) m.set_lease_key(it->second);
  }
  return r;
}

void CoordinatorService::Lead(const std::vector<v1::RunRecord>& records) {
  Finishes f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const v1::RunRecord& rec : records) {
      auto rdzv = Rendezvous::FromRecord(rec, clock_);
      if (!rdzv.ok()) {
        f.Warn(absl::StrCat("left out a run kept in etcd: ", rdzv.status().message()));
        continue;
      }
      Run run;
      run.rdzv = std::move(*rdzv);
      run.view = std::make_unique<JobView>(run.rdzv->config().straggler_factor);
      run.lease_key = rec.lease_key();
      for (const v1::MemberRecord& m : rec.members())
        if (!m.lease_key().empty()) run.node_keys[m.node().node_id()] = m.lease_key();
      run.next_tick = run.rdzv->Tick();
      f.Info(absl::StrCat("run '", rec.run_id(), "' carried on from etcd: round ", rec.round(), ", ",
                          rec.members_size(), " node(s), ", PhaseName(run.rdzv->phase())));
      runs_[rec.run_id()] = std::move(run);
    }
    {
      std::lock_guard<std::mutex> slock(store_mu_);
      stored_version_.clear();
      for (const v1::RunRecord& rec : records) stored_version_[rec.run_id()] = rec.version();
    }
    standby_ = false;
    leader_.clear();
    wake_.notify_all();
  }
  FinishAll(f);
}

void CoordinatorService::StandBy(const std::string& leader) {
  Finishes f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader_ = leader;
    if (standby_ && runs_.empty()) return;
    standby_ = true;
    const grpc::Status st = NotLeaderLocked();
    for (auto& [id, run] : runs_) {
      for (HeldCall* c : run.held) f.emplace_back(c, st);
      run.held.clear();
      for (WatchReactor* w : run.watchers) w->EndLocked(st, &f);
      run.watchers.clear();
    }
    runs_.clear();
    f.Warn(leader.empty() ? "this coordinator replica no longer leads"
                          : absl::StrCat("this coordinator replica stands by; the leader is at ", leader));
  }
  FinishAll(f);
}

grpc::Status CoordinatorService::Admit(grpc::CallbackServerContext* ctx, const google::protobuf::Message& req,
                                       const char* rpc) {
  grpc::Status st = CheckToken(ctx, rpc);
  if (!st.ok()) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (standby_ && std::string_view(rpc) != "Status") return NotLeaderLocked();  // a standby forwards Status
  }
  std::string why;
  st = CheckSize(ctx->peer(), req, rpc, &why);
  if (!st.ok()) spdlog::warn("{}", why);  // not under mu_
  return st;
}

grpc::Status CoordinatorService::CheckToken(grpc::CallbackServerContext* ctx, const char* rpc) {
  if (opts_.token.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenMetadataKey);
  std::string got = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
  if (it != md.end() && ConstantTimeEquals(got, opts_.token)) return grpc::Status::OK;
  spdlog::warn("rejected {} from {}: {} rendezvous token", rpc, ctx->peer(), it == md.end() ? "no" : "wrong");
  return grpc::Status(
      grpc::StatusCode::UNAUTHENTICATED,
      opts_.owner_only
          ? "this coordinator serves only the user who started it (on loopback without a token): run as that user, "
            "or give it and its clients --rdzv-token-file"
      : it == md.end()
          ? absl::StrCat("this coordinator needs a rendezvous token (--rdzv-token-file or ", kRdzvTokenEnv, ")")
          : "wrong rendezvous token");
}

absl::Status CoordinatorService::CheckNodeKey(const Run& run, const std::string& node_id, const std::string& presented,
                                              const std::string& peer, const char* rpc, Finishes* f) const {
  std::string derived;
  if (KeyMatches(presented, NodeKey(run, node_id, &derived))) return absl::OkStatus();
  absl::Status st = WrongNodeKey(node_id, !presented.empty());
  f->Warn(absl::StrCat("rejected ", rpc, " from ", peer, ": ", st.message()));
  return st;
}

absl::Status CoordinatorService::RoomForRun(const std::string& run_id) const {
  if (runs_.size() < static_cast<size_t>(kMaxRunsPerCoordinator)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("this coordinator holds ", runs_.size(), " runs, its limit (",
                                                   kMaxRunsPerCoordinator, "): run '", Shown(run_id),
                                                   "' is not taken until one ends"));
}

CoordinatorService::Run CoordinatorService::NewRun(const std::string& run_id, const RendezvousConfig& cfg) {
  Run run;
  run.rdzv = std::make_unique<Rendezvous>(run_id, cfg, clock_);
  run.view = std::make_unique<JobView>(cfg.straggler_factor);
  run.lease_key = NewLeaseKey();
  return run;
}

const std::string& CoordinatorService::NodeKey(const Run& run, const std::string& node_id, std::string* scratch) {
  if (auto it = run.node_keys.find(node_id); it != run.node_keys.end()) return it->second;
  *scratch = NodeLeaseKey(run.lease_key, node_id);
  return *scratch;
}

void CoordinatorService::set_lease_port(int port) {
  std::lock_guard<std::mutex> lock(mu_);
  lease_port_ = port;
}

void CoordinatorService::OnLeaseBatch(const std::vector<std::string>& datagrams) {
  std::lock_guard<std::mutex> lock(mu_);
  Run* run = nullptr;  // the run of the datagram being decoded
  std::string derived;
  auto key_for = [&](const std::string& run_id, const std::string& node_id) -> const std::string* {
    auto it = runs_.find(run_id);
    run = it == runs_.end() ? nullptr : &it->second;
    return run ? &NodeKey(*run, node_id, &derived) : nullptr;
  };
  for (const auto& d : datagrams) {
    auto beat = DecodeLeaseBeat(d, key_for);
    if (!beat) continue;  // forged, damaged, or for a run that is gone: a lost datagram
    if (run->rdzv->RenewLease(beat->node_id, beat->round, beat->seq)) run->udp_seen.insert(beat->node_id);
  }
}

bool CoordinatorService::AnswerIfReady(Run& run, HeldCall* c, Finishes* out) {
  Rendezvous& r = *run.rdzv;
  const std::string& id = c->join_req->node().node_id();
  if (auto a = r.AssignmentFor(id, c->join_req->last_round())) {
    *c->join_resp->mutable_assignment() = *a;
    std::string derived;
    c->join_resp->mutable_assignment()->set_lease_key(NodeKey(run, id, &derived));
    c->join_resp->mutable_assignment()->set_lease_port(lease_port_);
    out->emplace_back(c, grpc::Status::OK);
    return true;
  }
  if (auto refused = r.TakeJoinRefusal(id)) {
    out->Warn(absl::StrCat("run '", Shown(c->run_id), "': gave up on spare node ", Shown(id), " from ", c->peer, ": ",
                           refused->message()));
    out->emplace_back(c, ToGrpc(*refused));
    return true;
  }
  if (r.ended()) {
    out->emplace_back(c, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                      absl::StrCat("run '", Shown(c->run_id), "' ", PhaseName(r.phase()),
                                                   r.reason().empty() ? "" : ": ", r.reason())));
    return true;
  }
  return false;
}

void CoordinatorService::Pump(Run& run, Finishes* out) {
  if (store_ != nullptr) out->records.push_back(RecordOf(run));
  for (auto it = run.watchers.begin(); it != run.watchers.end();) (*it++)->PumpLocked(out);
  for (auto it = run.held.begin(); it != run.held.end();) {
    it = AnswerIfReady(run, *it, out) ? run.held.erase(it) : std::next(it);
  }
}

void CoordinatorService::TickNow(Run& run) {
  run.next_tick = run.rdzv->Tick();
  if (timer_sleeps_until_ == Clock::TimePoint::min()) return;  // it is running: it sees this run
  // An ended run is closed by the timer; a clock past the planned wake (a lagging thread, a test's
  // clock) needs it now.
  if ((run.next_tick && *run.next_tick < timer_sleeps_until_) || run.rdzv->ended() ||
      clock_->Now() >= timer_sleeps_until_) {
    wake_.notify_one();
  }
}

void CoordinatorService::Cancelled(HeldCall* call) {
  Finishes f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(call->run_id);
    if (it == runs_.end() || !it->second.held.erase(call)) return;  // already answered
    f.emplace_back(call, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    Rendezvous& r = *it->second.rdzv;
    uint64_t v = r.version();
    r.CancelJoin(call->join_req->node().node_id());
    TickNow(it->second);
    if (r.version() != v) Pump(it->second, &f);
  }
  FinishAll(f);
}

grpc::ServerUnaryReactor* CoordinatorService::Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                                   v1::JoinResponse* resp) {
  auto* call = new HeldCall(this, req, resp, ctx->peer());
  if (grpc::Status st = Admit(ctx, *req, "Join"); !st.ok()) {
    call->Finish(st);
    return call;
  }
  auto reject = [&](const absl::Status& st) {
    spdlog::warn("rejected join of node {} to run '{}' from {}: {}", Shown(req->node().node_id()), Shown(req->run_id()),
                 ctx->peer(), std::string(st.message()));
    call->Finish(ToGrpc(st));
    return call;
  };
  if (absl::Status st = ValidateJoin(*req); !st.ok()) return reject(st);
  Finishes f;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) {
      lock.unlock();
      call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
      return call;
    }
    auto it = runs_.find(req->run_id());
    if (it == runs_.end()) {
      RendezvousConfig cfg = opts_.defaults;
      if (req->has_spec()) {
        auto c = RendezvousConfig::FromSpec(req->spec());
        if (!c.ok()) {
          lock.unlock();
          return reject(c.status());
        }
        cfg = *c;
      }
      if (absl::Status room = RoomForRun(req->run_id()); !room.ok()) {
        lock.unlock();
        return reject(room);
      }
      it = runs_.emplace(req->run_id(), NewRun(req->run_id(), cfg)).first;
      f.Info(absl::StrCat("run '", Shown(req->run_id()), "': first node ", Shown(req->node().hostname()), " (",
                          Shown(req->node().node_id()), ") from ", ctx->peer()));
    }
    Run& run = it->second;
    const uint64_t version = run.rdzv->version();
    absl::Status st = run.rdzv->Join(*req);
    if (!st.ok()) {
      lock.unlock();
      FinishAll(f);
      return reject(st);
    }
    TickNow(run);
    if (run.rdzv->IsSpare(req->node().node_id())) {
      f.Info(absl::StrCat("run '", Shown(req->run_id()), "': node ", Shown(req->node().hostname()), " (",
                          Shown(req->node().node_id()), ") from ", ctx->peer(),
                          " waits as a spare: the round runs with its ", run.rdzv->config().max_nodes,
                          " node(s) (--nnodes max)"));
    }
    if (run.rdzv->version() != version) {  // a round formed or opened: every held call may be ready
      run.held.insert(call);
      Pump(run, &f);
    } else if (!AnswerIfReady(run, call, &f)) {  // only this join can have changed
      run.held.insert(call);
    }
  }
  FinishAll(f);
  return call;
}

absl::StatusOr<CoordinatorService::Run*> CoordinatorService::HeartbeatLocked(const std::string& peer,
                                                                             const std::string& node_key,
                                                                             const v1::HeartbeatRequest& req,
                                                                             v1::HeartbeatResponse* ans, Finishes* f) {
  if (absl::Status st = ValidateIds(req.run_id(), req.node_id()); !st.ok()) {
    f->Warn(absl::StrCat("rejected heartbeat from ", peer, ": ", st.message()));
    return st;
  }
  auto it = runs_.find(req.run_id());
  auto reject = [&](const absl::Status& st) {
    f->Warn(
        absl::StrCat("rejected re-registration of node ", Shown(req.node_id()), " from ", peer, ": ", st.message()));
    return st;
  };
  if (it == runs_.end()) {
    if (!req.has_assignment()) {
      ans->set_unknown_node(true);
      return nullptr;
    }
    auto cfg = Rendezvous::ConfigForReattach(req);
    absl::Status valid = cfg.ok() ? ValidateNode(req.run_id(), req.node()) : cfg.status();
    if (valid.ok()) valid = RoomForRun(req.run_id());
    // A restarted coordinator trusts the key a re-registering node brings (its datagrams' key).
    if (valid.ok() && !KeyMatches(node_key, req.assignment().lease_key())) {
      valid = WrongNodeKey(req.node_id(), !node_key.empty());
    }
    if (!valid.ok()) return reject(valid);
    it = runs_.emplace(req.run_id(), NewRun(req.run_id(), *cfg)).first;
  } else if (!it->second.rdzv->Knows(req.node_id())) {
    if (req.has_assignment() && req.has_node()) {
      // What a re-registration brings is kept: it is checked first, however the run was made.
      absl::Status valid = ValidateNode(req.run_id(), req.node());
      if (valid.ok() && !KeyMatches(node_key, req.assignment().lease_key())) {
        valid = WrongNodeKey(req.node_id(), !node_key.empty());
      }
      if (!valid.ok()) return reject(valid);
    }
  } else {
    RETURN_IF_ERROR(CheckNodeKey(it->second, req.node_id(), node_key, peer, "heartbeat", f));
  }
  Run& run = it->second;
  const bool known_before = run.rdzv->Knows(req.node_id());
  uint64_t v = run.rdzv->version();
  *ans = run.rdzv->Heartbeat(req);
  if (!known_before && run.rdzv->IsMember(req.node_id()) && req.assignment().lease_key().size() == kLeaseKeyBytes) {
    // A restarted coordinator keeps each re-registered node's lease key: its datagrams stay valid.
    run.node_keys[req.node_id()] = req.assignment().lease_key();
  }
  if (!known_before && req.has_assignment() && !ans->unknown_node()) {
    f->Info(absl::StrCat("run '", Shown(req.run_id()), "': node ", Shown(req.node().hostname()), " (",
                         Shown(req.node_id()), ") re-registered in round ", req.round(), " from ", peer));
  }
  if (run.rdzv->version() != v || !known_before) {
    TickNow(run);  // a re-registration rebuilds the run: its timers start now
    Pump(run, f);
  }
  if (EndsTheJob(OrderOf(*ans))) run.rdzv->NoteToldEnd(req.node_id());
  return &run;
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const v1::HeartbeatRequest* req, v1::HeartbeatResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status status = Admit(ctx, *req, "Heartbeat");
  Finishes f;
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
    } else if (auto run = HeartbeatLocked(ctx->peer(), PresentedNodeKey(ctx), *req, resp, &f); !run.ok()) {
      status = ToGrpc(run.status());
    }
  }
  if (!FinishAll(f) && status.ok()) {
    status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "this coordinator replica could not keep the run's state");
  }
  reactor->Finish(status);
  settled_.notify_all();
  return reactor;
}

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* CoordinatorService::Watch(
    grpc::CallbackServerContext* ctx) {
  return new WatchReactor(this, ctx);
}

grpc::ServerUnaryReactor* CoordinatorService::ReportExit(grpc::CallbackServerContext* ctx,
                                                         const v1::ReportExitRequest* req,
                                                         v1::ReportExitResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (grpc::Status st = Admit(ctx, *req, "ReportExit"); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
  if (absl::Status st = ValidateIds(req->run_id(), req->node_id()); !st.ok()) {
    spdlog::warn("rejected exit report from {}: {}", ctx->peer(), std::string(st.message()));
    reactor->Finish(ToGrpc(st));
    return reactor;
  }
  Finishes f;
  grpc::Status status = grpc::Status::OK;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(req->run_id());
    if (it == runs_.end()) {
      f.Warn(absl::StrCat("rejected exit report of node ", Shown(req->node_id()), " from ", ctx->peer(), ": no run '",
                          Shown(req->run_id()), "'"));
      status = grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no run '", Shown(req->run_id()),
                                                                      "' on this coordinator (unknown, or closed)"));
    } else if (absl::Status key = CheckNodeKey(it->second, req->node_id(), PresentedNodeKey(ctx), ctx->peer(),
                                               "exit report", &f);
               !key.ok()) {
      status = ToGrpc(key);
    } else {
      Run& run = it->second;
      uint64_t v = run.rdzv->version();
      *resp = run.rdzv->ReportExit(*req);
      for (const v1::WorkerExit& e : req->exits())
        if (e.hung()) run.view->NoteHung(req->round(), e.rank());
      if (resp->job_succeeded() || resp->job_failed()) run.rdzv->NoteToldEnd(req->node_id());
      TickNow(run);
      if (run.rdzv->version() != v) {
        if (!run.rdzv->reason().empty()) f.Info(absl::StrCat("run '", Shown(req->run_id()), "': ", run.rdzv->reason()));
        Pump(run, &f);
      }
    }
  }
  if (!FinishAll(f) && status.ok()) {
    status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "this coordinator replica could not keep the run's state");
  }
  reactor->Finish(status);
  settled_.notify_all();
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                                     v1::StatusResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status status = Admit(ctx, *req, "Status");
  bool forward = false;
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    forward = standby_;
  }
  if (forward) {
    // A standby asks the leader on the caller's behalf (so `launch status` works through any
    // replica); the answer says which replica answered.
    store_->ForwardStatus(*req, resp, [this, reactor, resp](absl::Status st) {
      if (st.ok()) *resp->mutable_replica() = store_->Describe();
      reactor->Finish(ToGrpc(st));
    });
    return reactor;
  }
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(req->run_id());
    if (it == runs_.end()) {
      status = grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no run '", Shown(req->run_id()), "'"));
    } else {
      *resp = StatusLocked(it->second);
    }
  }
  if (status.ok()) BoundStatusForWire(resp, kMaxStatusNodesBytes);
  if (status.ok() && store_ != nullptr) *resp->mutable_replica() = store_->Describe();
  reactor->Finish(status);
  return reactor;
}

void BoundStatusForWire(v1::StatusResponse* s, size_t budget) {
  for (v1::NodeStatus& n : *s->mutable_nodes()) n.mutable_node()->clear_addresses();
  if (s->ByteSizeLong() <= budget) return;
  google::protobuf::RepeatedPtrField<v1::NodeStatus> nodes;
  nodes.Swap(s->mutable_nodes());
  size_t used = s->ByteSizeLong();
  int kept = 0;
  for (v1::NodeStatus& n : nodes) {
    const size_t bytes = n.ByteSizeLong() + 6;  // its tag and length
    if (used + bytes > budget) break;
    used += bytes;
    *s->add_nodes() = std::move(n);
    ++kept;
  }
  s->set_nodes_omitted(nodes.size() - kept);
}

v1::StatusResponse CoordinatorService::StatusLocked(const Run& run) const {
  v1::StatusResponse s = run.rdzv->Status();
  run.view->Fill(&s, clock_->Now());
  return s;
}

std::vector<v1::StatusResponse> CoordinatorService::AllStatus() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::StatusResponse> out;
  for (const auto& [id, run] : runs_) out.push_back(StatusLocked(run));
  return out;
}

grpc::ServerUnaryReactor* CoordinatorService::Sample(grpc::CallbackServerContext* ctx, const v1::SampleRequest* req,
                                                     v1::SampleResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status status = Admit(ctx, *req, "Sample");
  absl::Status valid = absl::OkStatus();
  Finishes f;
  if (status.ok()) {
    valid = ValidateIds(req->run_id(), req->node_id());
    if (valid.ok()) valid = ValidateSample(*req);
    if (!valid.ok()) {
      spdlog::warn("rejected sample from {}: {}", ctx->peer(), std::string(valid.message()));
      status = ToGrpc(valid);
    }
  }
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(req->run_id());
    if (it == runs_.end()) {
      status = grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no run '", Shown(req->run_id()), "'"));
    } else if (!it->second.rdzv->IsMember(req->node_id()) || req->round() > it->second.rdzv->round()) {
      // Only the nodes of the run's round speak for its ranks.
      status = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("node ", Shown(req->node_id()), " is not in round ", req->round(), " of run '",
                                         Shown(req->run_id()), "'"));
    } else if (absl::Status key = CheckNodeKey(it->second, req->node_id(), PresentedNodeKey(ctx), ctx->peer(), "sample",
                                               &f);
               !key.ok()) {
      status = ToGrpc(key);
    } else {
      Run& run = it->second;
      run.view->Update(*req, clock_->Now());
      for (v1::StragglerEvent& e : run.view->EventsAfter(req->events_seen())) *resp->add_events() = std::move(e);
    }
  }
  FinishAll(f);
  reactor->Finish(status);
  return reactor;
}

void CoordinatorService::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  Clock::TimePoint last_awake = clock_->Now();
  while (!stopping_) {
    const auto now = clock_->Now();
    Finishes f;
    // Woken this late, the coordinator was not running (SIGSTOP, a paused VM): the agents' leases
    // were not renewed for a reason that is not theirs.
    if (const auto gap = now - last_awake; gap > kCoordinatorAwakePeriod + kCoordinatorPauseTolerance) {
      const auto paused = gap - kCoordinatorAwakePeriod;
      f.Warn(
          absl::StrFormat("the coordinator did not run for %.1f s (stopped or paused): every lease is extended by that",
                          std::chrono::duration<double>(paused).count()));
      for (auto& [id, run] : runs_) run.rdzv->ForgivePause(paused);
    }
    last_awake = now;
    auto next = now + std::chrono::seconds(3600);
    for (auto it = runs_.begin(); it != runs_.end();) {
      Rendezvous& r = *it->second.rdzv;
      std::optional<Clock::TimePoint>& due = it->second.next_tick;
      if (due && *due <= now) {
        uint64_t v = r.version();
        TickNow(it->second);
        if (r.version() != v) {
          if (!r.reason().empty()) f.Warn(absl::StrCat("run '", Shown(it->first), "': ", r.reason()));
          Pump(it->second, &f);
        }
      }
      if (due) next = std::min(next, *due);
      if (r.ended()) {
        auto close = r.ended_at() + r.config().close_timeout;
        if (now >= close && it->second.held.empty() && it->second.watchers.empty()) {
          f.Info(absl::StrCat("run '", Shown(it->first), "' closed (", PhaseName(r.phase()), ")"));
          if (store_ != nullptr) f.removed.push_back(it->first);
          it = runs_.erase(it);
          continue;
        }
        next = std::min(next, close);
      }
      ++it;
    }
    if (!f.empty()) {
      settled_.notify_all();
      lock.unlock();
      FinishAll(f);
      lock.lock();
      continue;
    }
    next = std::min(next, now + kCoordinatorAwakePeriod);
    timer_sleeps_until_ = next;
    wake_.wait_for(lock, std::max(next - clock_->Now(), Clock::TimePoint::duration(0)));
    timer_sleeps_until_ = Clock::TimePoint::min();
  }
}

std::unique_ptr<grpc::Server> CoordinatorServer::BuildServer(const std::string& address, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, creds_, port);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(kGrpcReceiveLimitBytes);
  builder.SetMaxSendMessageSize(kMaxRendezvousMessageBytes);
  // Two coordinators on one port would split a job in two: the second must fail to bind.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Pings find agents that vanished (a cut link) while their Join is held; the agents' own are let in.
  ApplyKeepalive(&builder);
  // A connection that does not finish its HTTP/2 (and TLS) handshake is closed after this long,
  // not gRPC's 120 s: connections that never speak hold a descriptor each only briefly.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, static_cast<int>(kHandshakeTimeout.count()));
  // Idle connections (no call for this long) are closed; an agent's channel reconnects when it
  // next calls, while a connection that holds a Watch stream or a Join is never idle.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, static_cast<int>(kMaxConnectionIdle.count()));
  // No channelz: nothing here reads it, and it registers every connection in a global table.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  return builder.BuildAndStart();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const std::string& listen,
                                                                            CoordinatorOptions opts,
                                                                            const SecurityOptions& security,
                                                                            const Clock* clock) {
  auto hp = ParseHostPort(listen, "listen");
  if (!hp.ok()) return hp.status();
  if (hp->port && *hp->port != 0) {
    auto in_use = PortInUse(hp->host, *hp->port);
    if (in_use.ok() && *in_use) return absl::AlreadyExistsError(absl::StrCat(listen, " is already in use"));
  }
  auto creds = MakeServerCredentials(security);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  // Without a token on loopback every local user could call it: it is its own user's alone.
  const bool owner_only = TakesLocalToken(hp->host, security.token, security.tls(), security.insecure);
  opts.token = owner_only ? absl::BytesToHexString(NewLeaseKey()) : security.token;
  opts.owner_only = owner_only;
  const std::string token = opts.token;
  s->creds_ = *creds;
  s->service_ = std::make_unique<CoordinatorService>(std::move(opts), clock);
  s->server_ = s->BuildServer(JoinHostPort(hp->host, hp->port.value_or(kDefaultRendezvousPort)), &s->port_);
  if (!s->server_ || s->port_ == 0) {
    if (hp->port && *hp->port != 0) {  // lost a race to bind it
      auto in_use = PortInUse(hp->host, *hp->port);
      if (in_use.ok() && *in_use) return absl::AlreadyExistsError(absl::StrCat(listen, " is already in use"));
    }
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  if (owner_only) {
    auto published = LocalTokenFile::Publish(s->port_, token);
    if (!published.ok()) return published.status();
    s->local_token_ = std::move(*published);
  }
  s->service_->Start();
  s->address_ = JoinHostPort(hp->host, s->port_);
  // Lease datagrams on the same port number, over UDP.
  s->leases_ = std::make_unique<LeaseListener>();
  CoordinatorService* svc = s->service_.get();
  if (absl::Status st = s->leases_->Start(hp->host, s->port_,
                                          [svc](const std::vector<std::string>& batch) { svc->OnLeaseBatch(batch); });
      st.ok()) {
    svc->set_lease_port(s->port_);
  } else {
    spdlog::warn("no lease datagrams ({}): agents heartbeat on their streams", std::string(st.message()));
    s->leases_.reset();
  }
  s->ReserveDescriptors();
  CoordinatorServer* raw = s.get();
  s->failure_subscription_ = SubscribeListenerFailures([raw] {
    std::lock_guard<std::mutex> lock(raw->keeper_mu_);
    raw->listener_failed_ = true;
    raw->keeper_wake_.notify_all();
  });
  s->keeper_ = std::thread([raw] {
    NameThisThread("launch-keeper");
    raw->KeepListening();
  });
  return s;
}

void CoordinatorServer::ReserveDescriptors() {
  for (UniqueFd& fd : spare_fds_) {
    if (!fd.valid()) fd.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
}

void CoordinatorServer::KeepListening() {
  std::unique_lock<std::mutex> lock(keeper_mu_);
  for (;;) {
    keeper_wake_.wait(lock, [&] { return stopping_ || listener_failed_; });
    if (stopping_) return;
    listener_failed_ = false;
    std::unique_ptr<grpc::Server> old = std::move(server_);
    lock.unlock();
    // The spare descriptors are given back now: the rebuild needs a few while the flood still
    // holds the rest (and so does UBSan's vptr check, which reads vtables through a pipe).
    for (UniqueFd& fd : spare_fds_) fd.Reset();
    spdlog::warn(
        "the coordinator at {} stopped accepting connections (out of file descriptors: a connection "
        "flood?); restarting its listener",
        address_);
    // The service and its runs stay; the connections of the old server close, and agents
    // reconnect and re-register as with a restarted coordinator. Descriptors come back as the
    // flood's connections close or time out (kHandshakeTimeout).
    if (old) old->Shutdown(std::chrono::system_clock::now() + kRelistenShutdownGrace);
    old.reset();
    int attempts = 0;
    for (;;) {
      int port = 0;
      std::unique_ptr<grpc::Server> server = BuildServer(address_, &port);
      lock.lock();
      if (server && port == port_) {
        server_ = std::move(server);
        listener_failed_ = false;  // the old listener's failure lines, if any came late
        ReserveDescriptors();
        spdlog::info("the coordinator at {} accepts connections again", address_);
        break;
      }
      if (server) server->Shutdown(std::chrono::system_clock::now());
      if (++attempts == 1) spdlog::warn("cannot listen on {} yet; retrying every second", address_);
      if (keeper_wake_.wait_for(lock, kRelistenRetry, [&] { return stopping_; })) return;
      lock.unlock();
    }
  }
}

std::shared_ptr<grpc::Channel> CoordinatorServer::InProcessChannel() {
  std::lock_guard<std::mutex> lock(keeper_mu_);
  return server_ ? server_->InProcessChannel(grpc::ChannelArguments()) : nullptr;
}

CoordinatorServer::~CoordinatorServer() {
  if (failure_subscription_) UnsubscribeListenerFailures(failure_subscription_);
  {
    std::lock_guard<std::mutex> lock(keeper_mu_);
    stopping_ = true;
    keeper_wake_.notify_all();
  }
  if (keeper_.joinable()) keeper_.join();
  if (leases_) leases_->Stop();
  if (service_) service_->Shutdown();
  // Every held call is answered by now; in-flight ones (a remote ReportExit) are cancelled.
  // Answers already given get a moment to reach the agents.
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + kServerShutdownGrace);
  server_.reset();
}

}  // namespace launch
