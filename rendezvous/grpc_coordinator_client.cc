#include "rendezvous/grpc_coordinator_client.h"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/tunables.h"
#include "rendezvous/grpc_wire.h"
#include "rendezvous/local_token.h"

namespace launch {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

GrpcCoordinatorClient::GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel, std::string target,
                                             std::string token, std::chrono::milliseconds join_timeout)
    : stub_(v1::Rendezvous::NewStub(channel)),
      target_(std::move(target)),
      token_(std::move(token)),
      join_timeout_(join_timeout) {}

void GrpcCoordinatorClient::SetNodeKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(key_mu_);
  node_key_ = key;
}

namespace {
void AddCredentials(grpc::ClientContext* ctx, const std::string& token, const std::string& node_key) {
  if (!token.empty()) ctx->AddMetadata(kTokenMetadataKey, token);
  if (!node_key.empty()) ctx->AddMetadata(kNodeKeyMetadataKey, node_key);
}
}  // namespace

std::string GrpcCoordinatorClient::CurrentToken() const {
  return token_.empty() && local_port_ > 0 ? ReadLocalToken(local_port_) : token_;
}

grpc::Status GrpcCoordinatorClient::Authed(std::optional<std::chrono::milliseconds> timeout,
                                           const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext ctx;
    if (timeout) ctx.set_deadline(std::chrono::system_clock::now() + *timeout);
    const std::string token = CurrentToken();
    {
      std::lock_guard<std::mutex> lock(key_mu_);
      AddCredentials(&ctx, token, node_key_);
    }
    grpc::Status s = call(&ctx);
    if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED || local_port_ == 0) return s;
    if (attempt < 2 && CurrentToken() != token) continue;  // a new coordinator published its token
    return StaleLocalToken(s, token);
  }
}

// A refusal of the token this user's own file gave for the port: a coordinator restarted on it
// (its agents called in the moment before it published its token) rather than another user's.
// Unreachable for now, so the caller retries and reads the file again; without a token of ours
// it is a refusal.
grpc::Status GrpcCoordinatorClient::StaleLocalToken(const grpc::Status& s, const std::string& token) const {
  if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED || local_port_ == 0 || !token_.empty() || token.empty()) {
    return s;
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("the coordinator refused the token of its port's file (", s.error_message(),
                                   "); it is new there and publishes its own"));
}

absl::StatusOr<v1::Assignment> GrpcCoordinatorClient::Join(const v1::JoinRequest& req, CallCanceller* cancel) {
  v1::JoinResponse resp;
  bool cancelled = false;
  bool timed_out = false;
  // The coordinator answers at its join timeout with the reason; this wait is for one that is
  // never reached. It is the agent's own, not a gRPC deadline: a deadline costs the coordinator a
  // timer for each held Join (and Debian's gRPC checks every timer in a debug table), which at
  // 16,384 nodes was a quarter of the round's time. A watchdog cancels the blocking call instead.
  grpc::Status s = Authed(std::nullopt, [&](grpc::ClientContext* ctx) {
    // A coordinator that is not up yet (another node is starting it) is waited for, not an error.
    ctx->set_wait_for_ready(wait_for_ready_);
    if (cancel && !cancel->Attach([ctx] { ctx->TryCancel(); })) {
      cancelled = true;
      return grpc::Status(grpc::StatusCode::CANCELLED, "join cancelled");
    }
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, join_timeout_ + kJoinDeadlineMargin, [&] { return done; })) {
        timed_out = true;
        ctx->TryCancel();
      }
    });
    grpc::Status st = stub_->Join(ctx, req, &resp);
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
    }
    cv.notify_all();
    watchdog.join();
    if (cancel) cancel->Detach();
    if (timed_out && st.error_code() == grpc::StatusCode::CANCELLED) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "");
    }
    return st;
  });
  if (cancelled) return absl::CancelledError("join cancelled");
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous join at ", target_, ": no answer within the join timeout (",
                     join_timeout_.count() / 1000.0,
                     " s); the coordinator is unreachable, or its TLS settings differ from this node's"));
  }
  if (!s.ok()) return FromGrpc(s, absl::StrCat("rendezvous join at ", target_));
  return resp.assignment();
}

absl::StatusOr<v1::HeartbeatResponse> GrpcCoordinatorClient::Heartbeat(const v1::HeartbeatRequest& req) {
  v1::HeartbeatResponse resp;
  grpc::Status s = Authed(kHeartbeatDeadline,
                          [&](grpc::ClientContext* ctx) { return stub_->Heartbeat(ctx, req, &resp); });
  if (!s.ok()) return FromGrpc(s, absl::StrCat("heartbeat to ", target_));
  return resp;
}

namespace {

class GrpcWatchStream final : public WatchStream {
 public:
  GrpcWatchStream(v1::Rendezvous::Stub* stub, const std::string& token, const std::string& node_key, std::string target,
                  std::function<grpc::Status(const grpc::Status&)> refused)
      : target_(std::move(target)), refused_(std::move(refused)) {
    AddCredentials(&ctx_, token, node_key);
    stream_ = stub->Watch(&ctx_);
  }
  ~GrpcWatchStream() override {
    if (!finished_) {
      ctx_.TryCancel();
      v1::HeartbeatResponse ignored;
      while (stream_->Read(&ignored)) {
      }
      stream_->Finish();
    }
  }
  bool Send(const v1::HeartbeatRequest& hb) override { return stream_->Write(hb); }
  bool Receive(v1::HeartbeatResponse* resp) override { return stream_->Read(resp); }
  absl::Status Finish() override {
    finished_ = true;
    return FromGrpc(refused_(stream_->Finish()), absl::StrCat("watch at ", target_));
  }
  void Cancel() override { ctx_.TryCancel(); }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>> stream_;
  std::string target_;
  std::function<grpc::Status(const grpc::Status&)> refused_;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<WatchStream> GrpcCoordinatorClient::Watch() {
  const std::string token = CurrentToken();
  std::lock_guard<std::mutex> lock(key_mu_);
  return std::make_unique<GrpcWatchStream>(stub_.get(), token, node_key_, target_,
                                           [this, token](const grpc::Status& s) { return StaleLocalToken(s, token); });
}

absl::StatusOr<v1::ReportExitResponse> GrpcCoordinatorClient::ReportExit(const v1::ReportExitRequest& req,
                                                                         std::chrono::milliseconds timeout) {
  v1::ReportExitResponse resp;
  grpc::Status s = Authed(timeout, [&](grpc::ClientContext* ctx) { return stub_->ReportExit(ctx, req, &resp); });
  if (!s.ok()) return FromGrpc(s, absl::StrCat("exit report to ", target_));
  return resp;
}

absl::StatusOr<v1::SampleResponse> GrpcCoordinatorClient::Sample(const v1::SampleRequest& req,
                                                                 std::chrono::milliseconds timeout) {
  v1::SampleResponse resp;
  grpc::Status s = Authed(timeout, [&](grpc::ClientContext* ctx) { return stub_->Sample(ctx, req, &resp); });
  if (!s.ok()) return FromGrpc(s, absl::StrCat("sample to ", target_));
  return resp;
}

}  // namespace launch
