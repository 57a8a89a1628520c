#include "launcher/coordinator.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}
}  // namespace

Rendezvous* CoordinatorService::RunFor(const std::string& run_id) {
  auto& slot = runs_[run_id];
  if (!slot) slot = std::make_unique<Rendezvous>(run_id, defaults_, clock_);
  return slot.get();
}

grpc::Status CoordinatorService::Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                                      v1::JoinResponse* resp) {
  std::unique_lock<std::mutex> lock(mu_);
  Rendezvous* rdzv = RunFor(req->run_id());
  absl::Status st = rdzv->Join(*req);
  if (!st.ok()) {
    spdlog::warn("rejected join of node {} from {}: {}", req->node().node_id(), ctx->peer(),
                 std::string(st.message()));
    return ToGrpc(st);
  }
  changed_.notify_all();
  const auto deadline = clock_->Now() + rdzv->config().join_timeout;
  for (;;) {
    if (auto a = rdzv->AssignmentFor(req->node().node_id(), req->last_round())) {
      *resp->mutable_assignment() = *a;
      return grpc::Status::OK;
    }
    if (shutting_down_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "join cancelled");
    const int was_waiting = rdzv->waiting_nodes();
    std::optional<Clock::TimePoint> wake = rdzv->Tick();
    if (rdzv->phase() == Rendezvous::Phase::kRunning) {
      changed_.notify_all();
      continue;
    }
    if (clock_->Now() >= deadline) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("round did not form within the join timeout: ", was_waiting,
                                       " of at least ", rdzv->config().min_nodes, " node(s) joined"));
    }
    // Wake at the last call, the deadline, or a change; at least every second to see cancels.
    auto until = std::min(deadline, clock_->Now() + std::chrono::seconds(1));
    if (wake) until = std::min(until, *wake);
    changed_.wait_for(lock, until - clock_->Now());
  }
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  *resp = RunFor(req->run_id())->Heartbeat(*req);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportExit(grpc::ServerContext*, const v1::ReportExitRequest* req,
                                            v1::ReportExitResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  *resp = RunFor(req->run_id())->ReportExit(*req);
  changed_.notify_all();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Status(grpc::ServerContext*, const v1::StatusRequest* req,
                                        v1::StatusResponse* resp) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runs_.find(req->run_id());
  if (it == runs_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no run '", req->run_id(), "'"));
  }
  *resp = it->second->Status();
  return grpc::Status::OK;
}

void CoordinatorService::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  changed_.notify_all();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const std::string& listen, RendezvousConfig defaults, const Clock* clock) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->service_ = std::make_unique<CoordinatorService>(defaults, clock);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(kMaxRendezvousMessageBytes);
  builder.SetMaxSendMessageSize(kMaxRendezvousMessageBytes);
  // A coordinator serves few, mostly idle, connections: one completion queue and a small poller
  // pool start much faster than gRPC's per-core defaults.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 8);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  auto hp = ParseHostPort(listen, "listen");
  s->address_ = JoinHostPort(hp.ok() ? hp->host : "127.0.0.1", s->port_);
  return s;
}

CoordinatorServer::~CoordinatorServer() {
  if (service_) service_->Shutdown();
  // Every RPC of ours has returned by now; in-flight ones (a Join from a remote agent) are cancelled.
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

}  // namespace launch
